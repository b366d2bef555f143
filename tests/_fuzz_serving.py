"""A seeded fuzzer for the serving commands' flags (deploy, deploy --kserve, bench, tune, status,
serve, undeploy), run in one process of its own: `python tests/_fuzz_serving.py SEED RUNS DIR`.

Each run draws a command, its positional argument and a random subset of its options (from the
click command itself, so a new flag is fuzzed without a change here), each given a hostile value
for its type: numbers out of range, not finite, in other scripts' digits, huge; strings empty,
with a newline, control bytes or 4 KB long; paths to a folder, a FIFO, /dev/zero, a missing
file, a PEM of the wrong kind. Every URL is a closed port on 127.0.0.1 and no run may start a
server: serve gets no repository it could serve, bench no local entry without --url, tune a
budget too small for a trial. A run passes when it exits 0, 1, 2 or 130 without an internal error
or a traceback, within 30 s. Prints one JSON object: the runs and each one that did not pass."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import sys
from pathlib import Path

from _helpers import closed_port  # run as tests/_fuzz_serving.py: tests/ is on the path

HOSTILE_NUMBERS = ["0", "-1", "-0", "1e400", "nan", "inf", "-inf", "٣", "１２", "2147483648", "99999999999999999999",
                   "0x10", "1_000", " 3", "3 ", "", "1.5", "abc", "1e-400", "−1"]
HOSTILE_TEXT = ["", " ", "a\nb", "\x01", "../../../etc", "/abs", "..", ".", "-x", "é" * 20, "a" * 4096,
                "[kube]", "{}", "%s%n", "mlp", "mlp\n", "CON", "a/b", "\u202e", "=", ",", "x=1,y"]



def _paths(d: Path) -> list[str]:
    fifo = d / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    (d / "empty").write_bytes(b"")
    (d / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n")
    (d / "cert.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    (d / "garbage").write_bytes(os.urandom(512))
    (d / "dir").mkdir(exist_ok=True)
    return [str(d / n) for n in ("fifo", "empty", "key.pem", "cert.pem", "garbage", "dir", "missing")] + \
        ["/dev/zero", "/dev/null", "/proc/self/mem", str(d / "out" / "x"), str(d / "dir" / "new.json")]


def _value(param, rng: random.Random, paths: list[str], url: str) -> str | None:
    name = param.opts[0]
    kind = type(param.type).__name__
    if "url" in name:
        return rng.choice([url, url.replace("grpc://", "http://"), url.replace("grpc://", "grpcs://"),
                           "grpc://[::1", "ftp://127.0.0.1:1", "javascript:alert(1)", "file:///etc/passwd",
                           "http://u:p@127.0.0.1:1", "127.0.0.1:0", "grpc://127.0.0.1:99999", "\n"])
    plausible = rng.random() < 0.5   # half the values pass their flag's check: later checks are reached
    if kind in ("IntRange", "IntParamType", "FloatRange", "FloatParamType"):
        return str(rng.choice([1, 2, 4, 8, 16])) if plausible else rng.choice(HOSTILE_NUMBERS)
    if kind == "Path" or kind == "File":
        return rng.choice(paths)
    if kind == "Choice":
        return rng.choice(list(param.type.choices)) if plausible else rng.choice(["", "nope", "GRPC"])
    if plausible and name in ("--dims", "--warmup-dims"):
        return rng.choice(["N=2", "batch=1", "N=0", "N=2,N=3", "x=99999999"])
    return rng.choice(HOSTILE_TEXT + paths + [rng.choice(HOSTILE_NUMBERS)])


def _positional(command: str, rng: random.Random, entry: str, paths: list[str]) -> list[str]:
    if command == "serve":   # never a repository it could serve
        return [rng.choice([p for p in paths if not p.endswith("/dir")] + ["\n"])]   # "" is the current folder
    if command in ("undeploy",):
        return [rng.choice(HOSTILE_TEXT)]
    if command == "status":
        return []
    return [rng.choice([entry, entry + "/", entry + "/1", "mlp"] + paths + HOSTILE_TEXT[:8])]


def _case(cmds: dict, rng: random.Random, entry: str, paths: list[str], url: str) -> list[str]:
    command = rng.choice(["deploy", "deploy", "bench", "tune", "status", "serve", "undeploy"])
    c = cmds[command]
    args = [command, *_positional(command, rng, entry, paths)]
    # --check-image-runtime installs the image's packages from the index (its own tests cover it)
    options = [p for p in c.params if p.opts and p.opts[0].startswith("--")
               and p.opts[0] not in ("--help", "--debug", "--check-image-runtime")]
    if command == "deploy" and rng.random() < 0.4:
        args.append("--kserve")
    for p in rng.sample(options, k=min(len(options), rng.randint(0, 6))):
        if p.is_flag if hasattr(p, "is_flag") else False:
            args.append(rng.choice(p.opts + list(getattr(p, "secondary_opts", []) or [])))
            continue
        v = _value(p, rng, paths, url)
        args += [p.opts[0], v]
    if command in ("bench", "status", "undeploy") and "--url" not in args:
        args += ["--url", url]   # bench of a local entry would start a server
    if command == "deploy" and "--url" not in args and not ("--kserve" in args or "--dry-run" in args):
        args += ["--url", url]
    if command == "tune":
        args += ["--budget-s", rng.choice(["0", "-1", "nan", "inf", "0.5", "abc", "٣", "1e-9"])]
    if command == "deploy" and "--apply" in args:
        args += ["--kubeconfig", rng.choice(paths)]
    if rng.random() < 0.3:
        args.append("--json")
    return args


class _Hang(Exception):
    pass


def main() -> None:
    seed, runs, d = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    os.environ["MCP_STATE_DIR"] = str(d / "state")
    os.environ["KUBECONFIG"] = str(d / "missing-kubeconfig")
    import typer.main

    from mcp_compiler.cli.application import with_target_commands

    app = with_target_commands()
    cmds = typer.main.get_command(app).commands
    entry = str(d / "repo" / "mlp")
    paths = _paths(d)
    url = f"grpc://127.0.0.1:{closed_port()}"
    rng = random.Random(seed)
    bad = []
    codes: dict[str, int] = {}

    def alarm(*_):
        raise _Hang()

    for k in range(runs):
        args = _case(cmds, rng, entry, paths, url)
        out, err = io.StringIO(), io.StringIO()
        code = None
        signal.signal(signal.SIGALRM, alarm)
        signal.alarm(30)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    typer.main.get_command(app).main(args, prog_name="mcp-cli", standalone_mode=True)
                except SystemExit as e:
                    code = e.code
        except _Hang:
            code = "hang"
        except BaseException as e:  # noqa: BLE001 - what escaped the CLI is the finding
            code = f"escaped {type(e).__name__}: {e}"
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGINT, signal.default_int_handler)   # serve's body installs its own
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        text = err.getvalue()
        codes[str(code)] = codes.get(str(code), 0) + 1
        ok = code in (0, 1, 2, 130, None) and "internal error" not in text and "Traceback" not in text
        if not ok:
            bad.append({"run": k, "args": args, "code": code, "stderr": text[-600:]})
    sys.__stdout__.write(json.dumps({"runs": runs, "seed": seed, "codes": codes, "bad": bad}) + "\n")


if __name__ == "__main__":
    main()
