"""A decoder's tokenizer and chat template in the entry's runtime: `tokenizers` and jinja2's sandbox.

mcp-cli builds the TokenizerInfo (from GGUF metadata or the files beside an ONNX decoder) and
stores it in the model's metadata; the served entry reads it back here. `StreamText` turns the
tokens of a generation into text deltas: never half a UTF-8 character, and never text that a
stop string might still claim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

_REPLACEMENT = "\ufffd"


@dataclass
class TokenizerInfo:
    tokenizer_json: str
    chat_template: str | None
    bos_id: int | None
    eos_ids: list[int]
    add_bos: bool = False
    special: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"chat_template": self.chat_template, "bos_id": self.bos_id, "eos_ids": self.eos_ids,
                           "add_bos": self.add_bos})

    @classmethod
    def from_json(cls, meta: str, tokenizer_json: str) -> TokenizerInfo:
        d = json.loads(meta)
        return cls(tokenizer_json, d.get("chat_template"), d.get("bos_id"), list(d.get("eos_ids", [])),
                   bool(d.get("add_bos")))

    @classmethod
    def from_metadata(cls, meta: dict) -> TokenizerInfo | None:
        """From a model's metadata (`mcp.tokenizer`, `mcp.generation`); None when it has none."""
        if "mcp.tokenizer" not in meta:
            return None
        return cls.from_json(meta.get("mcp.generation", "{}"), meta["mcp.tokenizer"])


class ChatTokenizer:
    """encode / decode / the chat template, over a TokenizerInfo. ImportError without the
    `tokenizers` package; ValueError for a chat without a template."""

    def __init__(self, info: TokenizerInfo) -> None:
        from tokenizers import Tokenizer

        self.info = info
        self.tok = Tokenizer.from_str(info.tokenizer_json)

    def encode(self, text: str) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if self.info.add_bos and self.info.bos_id is not None:
            ids = [self.info.bos_id, *ids]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def token(self, i: int) -> str:
        return self.tok.id_to_token(i)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.info.chat_template:
            raise ValueError("the model has no chat template: give a plain prompt")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        bos = self.token(self.info.bos_id) if self.info.bos_id is not None else ""
        eos = self.token(self.info.eos_ids[0]) if self.info.eos_ids else ""
        return env.from_string(self.info.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos)


class StreamText:
    """The text of a generation's tokens, handed out as deltas. A delta never ends inside a UTF-8
    character (the decoder's replacement character is held back) nor inside a possible start of a
    stop string; `push` returns (delta, stopped): on a stop string the text ends before it.
    `take(event)` is the same for the engine's events: a token's delta, and at the end what
    was held back (nothing after a stop string); `stopped` says whether one came."""

    def __init__(self, decode, stops: list[str]) -> None:  # noqa: ANN001 - ids -> str
        self.decode, self.stops = decode, [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0          # characters of the text handed out
        self.text = ""
        self.stopped = False

    def take(self, event: dict) -> str:
        """The text delta of an engine event ({"token": id}, or the final one)."""
        if "token" in event:
            delta, self.stopped = self.push(event["token"])
            return delta
        return "" if self.stopped else self.flush()

    def push(self, token: int) -> tuple[str, bool]:
        self.ids.append(token)
        self.text = self.decode(self.ids)
        for s in self.stops:
            at = self.text.find(s, max(0, self.sent - len(s) + 1))
            if at >= 0:
                delta = self.text[self.sent:at] if at > self.sent else ""
                self.sent = max(self.sent, at)
                self.text = self.text[:self.sent]
                return delta, True
        end = len(self.text) - self.hold
        if self.text.endswith(_REPLACEMENT):
            end = min(end, len(self.text) - 1)
        if end <= self.sent:
            return "", False
        delta, self.sent = self.text[self.sent:end], end
        return delta, False

    def flush(self) -> str:
        """What is left at the end (held back for a stop string that never came)."""
        delta, self.sent = self.text[self.sent:], len(self.text)
        return delta
