"""Verifiable rewards (algorithm §8): strict <think>/<answer> format + math-verify; arithmetic match.

Every receiver recomputes rewards from decoded text, so the reward must be cheap, deterministic
and safe against hostile completions from any thread:

- math-verify's own timeout uses ``signal.alarm`` (main thread only). In-process we call it with
  ``parsing_timeout=None`` / ``timeout_seconds=None``, and only for short, plain numeric text
  (digits, ``,.$+-/``, ``\\frac``, ``\\boxed``), which sympy handles in microseconds.
- Anything else goes to a **judge subprocess** (started on first use, one per process, shared
  under a lock) with a hard deadline: measured here, a 600-char nested ``\\sin(`` took 28 s to
  parse and ``9^{9^{9^{9}}}`` never finishes verifying, so a length cap alone does not bound
  time. On deadline the judge is killed (restarted on the next call) and the answer scores 0.
- Answers longer than ``MAX_ANSWER_CHARS`` score 0 without being parsed.

This file is also the judge's entry point (``python -P rewards.py``), so its top-level imports
are stdlib only.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The User asks a question and the Assistant "
    "solves it. The Assistant first reasons step by step, then gives the final answer. The "
    "reasoning goes inside <think> </think> tags and the final answer inside <answer> </answer> "
    "tags, and nothing comes after the answer: <think> reasoning here </think><answer> final "
    "answer here </answer>"
)
MAX_ANSWER_CHARS = 1000
"""Longer <answer> contents are scored 0 unparsed (GSM8K/MATH answers are far shorter)."""
JUDGE_TIMEOUT_S = 10.0
"""Hard wall-clock limit for one judge-subprocess comparison."""
_JUDGE_START_TIMEOUT_S = 120.0  # importing sympy + antlr on a loaded 2-core box
_JUDGE_MEMORY_BYTES = 4 << 30  # address-space cap for the judge: huge powers die, not the host

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_FAST = re.compile(r"(?:[\s$,.+\-/0-9{}]|\\boxed|\\[dt]?frac|\\\$)*")
_FAST_MAX_CHARS = 48


def parse_strict_answer(completion: str) -> str | None:
    """The stripped <answer> content if the completion is strictly formatted, else None.

    Strict: exactly one of each tag; ``<think>`` first (only whitespace before it), ``</think>``,
    then only whitespace before ``<answer>``, then ``</answer>`` with only whitespace after it.
    An empty answer is not an answer (None). Decode completions with ``skip_special_tokens=True``
    so EOS text does not count as trailing text; if a prompt template already ends with
    ``<think>``, prepend it to the completion before calling this.
    """
    if not isinstance(completion, str) or any(completion.count(t) != 1 for t in _TAGS):
        return None
    t_open, t_close, a_open, a_close = (completion.index(t) for t in _TAGS)
    if not t_open < t_close < a_open < a_close:
        return None
    if completion[:t_open].strip() or completion[a_close + len("</answer>") :].strip():
        return None
    if completion[t_close + len("</think>") : a_open].strip():
        return None
    answer = completion[a_open + len("<answer>") : a_close].strip()
    return answer or None


def gsm8k_gold(answer_text: str) -> str:
    """GSM8K gold: the text after the last ``####``, stripped, thousands commas removed."""
    if "####" not in answer_text:
        raise ValueError(f"GSM8K answer has no '####' marker: {answer_text[-80:]!r}")
    gold = answer_text.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise ValueError(f"GSM8K answer has nothing after '####': {answer_text[-80:]!r}")
    return gold


def arithmetic_reward(completion: str, gold: str) -> float:
    """1.0 iff the completion is exactly the gold text, surrounding whitespace aside."""
    if not gold.strip():
        raise ValueError("arithmetic gold answer is empty")
    return 1.0 if completion.strip() == gold.strip() else 0.0


def math_reward(
    completion: str, gold: str, *, format_credit: float = 0.0, timeout_s: float = JUDGE_TIMEOUT_S
) -> float:
    """1.0 for strict format + answer equal to gold under math-verify; format_credit for format
    alone; 0.0 otherwise. Never raises on model output; safe from any thread."""
    answer = parse_strict_answer(completion)
    if answer is None:
        return 0.0
    return 1.0 if math_equal(answer, gold, timeout_s=timeout_s) else float(format_credit)


def math_equal(answer: str, gold: str, *, timeout_s: float = JUDGE_TIMEOUT_S) -> bool:
    """math-verify equivalence of an answer to the gold answer, time-bounded (module docstring)."""
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"gold answer must be a non-empty str, got {gold!r}")
    if not answer.strip() or len(answer) > MAX_ANSWER_CHARS:
        return False
    if _is_fast(answer) and _is_fast(gold):
        with _INPROC_LOCK:
            return _verify(answer, gold, None)
    return _JUDGE.ask(answer, gold, timeout_s)


def _is_fast(text: str) -> bool:
    return len(text) <= _FAST_MAX_CHARS and _FAST.fullmatch(text) is not None


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, op_timeout: int | None):
    from math_verify import parse

    gold = gold.strip()  # gold is bare LaTeX or a number: wrapped first, as written if that fails
    return parse(f"${gold}$", parsing_timeout=op_timeout) or parse(gold, parsing_timeout=op_timeout)


def _verify(answer: str, gold: str, op_timeout: int | None) -> bool:
    """math-verify on the answer as written and wrapped in $...$ (either may parse better:
    plain text such as '1000 dollars' vs bare LaTeX such as '\\sqrt 2' or '(1, 2)')."""
    from math_verify import parse, verify  # outside the try: a missing package must be loud

    try:
        gold_parsed = _parse_gold(gold, op_timeout)
        if not gold_parsed:
            log.warning("math-verify cannot parse gold answer %r: every answer scores 0", gold)
            return False
        for candidate in (answer, f"${answer}$"):
            parsed = parse(candidate, parsing_timeout=op_timeout)
            if parsed and verify(gold_parsed, parsed, timeout_seconds=op_timeout):
                return True
        return False
    except Exception:  # noqa: BLE001 - any failure inside math-verify/sympy is a wrong answer
        log.debug("math-verify failed on %r vs %r", answer[:80], gold, exc_info=True)
        return False


_INPROC_LOCK = threading.Lock()


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that we disabled its signal timeout; we bound time ourselves."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


class RewardJudgeError(RuntimeError):
    """The judge subprocess could not be started: the environment is broken, not the answer."""


class _Judge:
    """One math-verify subprocess, spoken to with JSON lines, killed when it overruns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._buf = b""
        self.timeouts = 0
        self.restarts = 0

    def ask(self, answer: str, gold: str, timeout_s: float) -> bool:
        op_timeout = max(1, int(timeout_s // 4))  # the judge's own per-call signal timeouts
        request = json.dumps({"a": answer, "g": gold, "t": op_timeout}).encode() + b"\n"
        with self._lock:
            proc = self._ensure()
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
                line = self._readline(time.monotonic() + timeout_s)
            except (BrokenPipeError, EOFError, OSError):
                log.warning("reward judge died on %r; scored 0, restarting", answer[:80])
                self._stop()
                return False
            if line is None:
                self.timeouts += 1
                log.warning(
                    "reward judge over %.1fs on %r; scored 0, restarting", timeout_s, answer[:80]
                )
                self._stop()
                return False
            return line == b"1"

    def _ensure(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        self.restarts += 1
        self._proc = subprocess.Popen(
            [sys.executable, "-P", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            line = self._readline(time.monotonic() + _JUDGE_START_TIMEOUT_S)
        except EOFError:
            line = b"judge exited during start"
        if line != b"ready":
            self._stop()
            raise RewardJudgeError(f"math-verify judge subprocess failed to start: {line!r}")
        return self._proc

    def _readline(self, deadline: float) -> bytes | None:
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise EOFError("judge closed its output")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.strip()

    def _stop(self) -> None:
        proc, self._proc, self._buf = self._proc, None, b""
        if proc is not None:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                stream.close()

    def close(self) -> None:
        with self._lock:
            self._stop()


_JUDGE = _Judge()
atexit.register(_JUDGE.close)


def _serve() -> None:
    """Judge main loop: one JSON request per stdin line, '1'/'0' per stdout line."""
    out, sys.stdout = sys.stdout.buffer, sys.stderr
    logging.disable(logging.CRITICAL)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (_JUDGE_MEMORY_BYTES, _JUDGE_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass  # best effort: the parent's deadline still bounds time
    try:
        if not _verify("1/2", "0.5", 1):
            raise RuntimeError("math-verify says 1/2 != 0.5")
    except Exception as e:  # noqa: BLE001 - report why we cannot serve, then leave
        out.write(f"error {type(e).__name__}: {e}\n".encode())
        out.flush()
        return
    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        req = json.loads(line)
        out.write(b"1\n" if _verify(req["a"], req["g"], req["t"]) else b"0\n")
        out.flush()


if __name__ == "__main__":
    _serve()
