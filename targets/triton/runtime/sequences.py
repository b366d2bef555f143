"""Per-sequence state kept on the server, for a model with state pairs (an input it reads its
state from, an output of the next state): Triton's sequence batcher routes every request of a
sequence (one correlation ID) to this model with START/END flags, and this table holds each
sequence's state between its requests. Clients send only the non-state inputs.

A sequence's state starts at zeros on START (a growing KV cache: empty, length 0 along the axis
it grows on, at most `max_length` long) and is dropped on END, after `idle_s` without a request,
or never more than `max_sequences` at once (a START past that is refused, naming the limit).
Imports numpy only; the serving runtime and `mcp-cli verify` both drive it.
"""

import time

import numpy as np


class StateTableFull(RuntimeError):
    pass


class SequenceState:
    def __init__(self, pairs, max_sequences=1024, idle_s=60.0, clock=time.monotonic):
        """`pairs`: [{"input", "output", "dtype", "shape"}] (a static shape, numpy dtype name)."""
        self.pairs = list(pairs)
        self.max_sequences, self.idle_s, self.clock = int(max_sequences), float(idle_s), clock
        self.table = {}   # correlation ID -> (last used, {state input: array})

    @property
    def outputs(self):
        return [p["output"] for p in self.pairs]

    def _zeros(self):
        return {p["input"]: np.zeros(p["shape"], dtype=np.dtype(p["dtype"])) for p in self.pairs}

    def expire(self):
        """Drop the sequences idle for longer than idle_s; returns how many."""
        now = self.clock()
        old = [k for k, (t, _) in self.table.items() if now - t > self.idle_s]
        for k in old:
            del self.table[k]
        return len(old)

    def state(self, corrid, start):
        """The state to run sequence `corrid`'s request with (zeros on START)."""
        self.expire()
        if start or corrid not in self.table:
            if not start:
                raise KeyError(f"sequence {corrid} has no state: it did not START, ended, or was idle past "
                               f"{self.idle_s:g} s")
            if corrid not in self.table and len(self.table) >= self.max_sequences:
                raise StateTableFull(f"{self.max_sequences} sequences hold state already (max_sequences): "
                                     "end one first")
            return self._zeros()
        return self.table[corrid][1]

    def step(self, run, feeds, outputs, corrid, start, end):
        """Run one request of sequence `corrid`: `run(feeds, names)` is the model; returns the
        values of `outputs` and keeps (or on END drops) the next state."""
        state = self.state(corrid, start)
        got = run({**feeds, **state}, list(outputs) + self.outputs)
        for p, nxt in zip(self.pairs, got[len(outputs):]):
            shape, axis = list(np.shape(nxt)), p.get("grows_axis")
            fits = len(shape) == len(p["shape"]) and all(a == b for k, (a, b) in enumerate(zip(shape, p["shape"]))
                                                         if k != axis)
            if not fits:
                self.table.pop(corrid, None)
                raise ValueError(f"state output {p['output']!r} has shape {shape}, the state input "
                                 f"{p['input']!r} takes {p['shape']}: this model cannot be served stateful "
                                 "(convert it with --no-state)")
            if axis is not None and shape[axis] > p["max_length"]:
                self.table.pop(corrid, None)
                raise ValueError(f"sequence {corrid}: state {p['input']!r} is {shape[axis]} long, past max_state_length "
                                 f"{p['max_length']}: the sequence is dropped; start a new one")
        if end:
            self.table.pop(corrid, None)
        else:
            self.table[corrid] = (self.clock(), dict(zip((p["input"] for p in self.pairs), got[len(outputs):])))
        return got[:len(outputs)]
