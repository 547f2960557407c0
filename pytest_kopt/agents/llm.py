"""The LLM agent: a model behind any OpenAI-compatible chat-completions endpoint writes each
kernel itself, reads the judge's verdicts, timings and profiles through tool calls, and keeps
at it for as long as the budget lasts.

Why it is shaped this way:
- The objective (problem, headline shapes, metric, baseline and floor, honesty rules, current
  best, budget) is the system message of *every* request, rebuilt each time, so call 700 aims
  at the same target as call 1 even after the conversation has been compacted.
- The conversation is rebuilt from the event log on resume: each ``llm_request`` records the
  messages added since the previous request, each ``llm_response`` the assistant message, each
  ``compaction`` the memory that replaced everything before it. Nothing else holds state.
- Compaction is deterministic (``memory.build_memory`` over the log), never model-written.
- The model's reply is untrusted: its arguments only reach ``Toolbox.call``, whose candidates
  only run inside the judge. Bad JSON, unknown tools and ids come back to the model as errors,
  and each such call costs one unit like any other (``Toolbox.reject`` for arguments that are not
  JSON). ``max_malformed`` replies in a row whose tool calls are all malformed stop the run with
  ``ModelMisbehaving``: not a success, and resumable. Replies with no tool call at all are nudged;
  ``max_idle_turns`` of them in a row and the agent says it has nothing left to try.
- The API key is read from the environment once, handed to the openai client and nowhere else.
  It is registered with the event log's scrubber, and a reply's text and tool-call arguments are
  scrubbed as they arrive, so nothing downstream (the log, candidate files, the memory, the next
  requests, a replay of the run) ever holds it.
- Parallel tool calls: with ``--kopt-workers=N`` the calls of one reply are all issued before any
  result is awaited (``Toolbox.submit``), so up to N evaluations run at once; each is one call of the
  budget, numbered in the reply's order, and the results go back in the reply's order. The system
  message says so, and that a *contended* timing (it shared its device) never becomes the best.
- Transient failures (rate limits, 5xx, time-outs, refused connections) are retried by the
  openai client with its own backoff; when it gives up, the agent pauses and tries again a few
  times, then raises ``EndpointUnavailable``, which the loop records as ``run_interrupted``:
  the run resumes later from its log with nothing lost.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import openai

from .. import events as ev
from ..events import read_events, register_secret, scrub
from ..judge.policy import ALLOWED_IMPORTS
from ..judge.sandbox import scrub_env
from .base import Agent
from .memory import build_memory

# Conversation size (tokens) before compaction, by model-name prefix: ~60% of the hosted
# window, so that the objective, the reply and a large tool result still fit. Open-weight models
# (Qwen, Llama, DeepSeek, ...) are often served with a shorter window than they support, so they
# get the fallback; raise it with --kopt-context-tokens when the server allows more.
CONTEXT_DEFAULTS = (
    ("gpt-4.1", 600_000),
    ("gpt-5", 240_000),
    ("gpt-4o", 76_000),
    ("o1", 120_000),
    ("o3", 120_000),
    ("o4", 120_000),
    ("claude", 120_000),
    ("gemini", 600_000),
)
FALLBACK_CONTEXT_TOKENS = 20_000  # fits a 32k-token server with room for the reply
# Retries: the openai client retries a failed request DEFAULT_RETRIES times with its own
# backoff (0.5 s doubling to 8 s, or the server's Retry-After); when it gives up the agent pauses
# DEFAULT_PAUSE_S, doubling, up to DEFAULT_PAUSES times (~8 minutes in all) before the run stops.
# The environment variables KOPT_LLM_RETRIES, KOPT_LLM_PAUSE_S and KOPT_LLM_PAUSES override them.
DEFAULT_RETRIES = 3
DEFAULT_PAUSE_S = 30.0
DEFAULT_PAUSES = 4

SOURCE_RESULT_CHARS = 80_000  # show_candidate / show_reference results (other results: max_result_chars)
HIDDEN_ARGS = {"write_candidate": ("strategy", "knobs")}  # the search agent's, not the model's

START = (
    "Begin. Read the problem and reference if you need to, then write a first candidate, test it, "
    "benchmark it and improve on it. Every tool call costs one unit of the budget."
)
NUDGE = (
    "Your reply had no tool call. Continue by calling a tool (write_candidate, run_tests, benchmark, "
    "profile, ...); every step of this work happens through tool calls."
)
CONTINUE = "\n\nContinue from this memory: pick the most promising open lead and call a tool."


class EndpointError(RuntimeError):
    """The LLM endpoint cannot serve this run now; the run stops resumably (``run_interrupted``)."""

    resumable = True


class EndpointUnavailable(EndpointError):
    """The endpoint stayed unreachable or overloaded through every retry and pause."""


class ModelMisbehaving(RuntimeError):
    """The model sent ``max_malformed`` replies in a row whose tool calls were all malformed: the run stops
    (``run_interrupted``, a non-zero exit), and a resume gives the model another turn."""

    resumable = True


def _setting(value: Any, env: str, default: Any) -> Any:
    if value is not None:
        return value
    return os.environ.get(env) or default


def estimate_tokens(obj: Any) -> int:
    """A rough token count (4 characters a token), used when the server reports no usage."""
    text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return len(text) // 4 + 1


def default_context_tokens(model: str) -> int:
    name = model.lower().rsplit("/", 1)[-1]
    for prefix, tokens in CONTEXT_DEFAULTS:
        if name.startswith(prefix):
            return tokens
    return FALLBACK_CONTEXT_TOKENS


def tool_specs(schemas: dict[str, dict]) -> list[dict]:
    """OpenAI ``tools`` entries from the Toolbox's argument schemas."""
    specs = []
    for name, schema in schemas.items():
        params = {k: v for k, v in dict(schema).items() if k != "description"}
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        hidden = HIDDEN_ARGS.get(name, ())
        if hidden:
            params["properties"] = {k: v for k, v in params["properties"].items() if k not in hidden}
            if "required" in params:
                params["required"] = [r for r in params["required"] if r not in hidden]
        description = schema.get("description") or name
        specs.append({"type": "function", "function": {"name": name, "description": description, "parameters": params}})
    return specs


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def render_objective(objective: dict, best: dict | None, budget_used: int, budget: int, workers: int = 1) -> str:
    """The system message: the objective, the current best and the budget, every request."""
    o = dict(objective or {})
    lines = ["You are optimizing a GPU kernel written in Triton. The objective below is fixed for the whole run."]
    lines.append(f"Problem: {o.pop('problem', '?')} — {o.pop('description', '')}".rstrip(" —"))
    if "signature" in o:
        lines.append(f"Candidate signature: {o.pop('signature')}")
    outputs = o.pop("outputs", None)
    if outputs:
        lines.append("Outputs and tolerances: " + "; ".join(
            f"{x.get('name')}: {x.get('metric', 'relative RMS error')} <= {x.get('tolerance')}" if isinstance(x, dict) else _fmt(x)
            for x in outputs))
    headline = o.pop("headline", None)
    if headline:
        lines.append("Headline shapes: " + "; ".join(map(_fmt, headline)))
    score, metric, case = o.pop("score", None), o.pop("metric", None), o.pop("case", None)
    if score:  # what the objective's number is: a geometric mean where several cases are timed
        lines.append(f"Objective ({metric} time): {score}.")
    elif metric:  # a log from before the metric was named: its text
        lines.append(f"Objective: {metric}.")
    if case:
        lines.append(f"Timed on: {case}" + (" (every one counts: a candidate tuned for one case must not regress the others)" if "geomean" in str(case) else ""))
    lines.append("Speedup = baseline time / candidate time (higher is better), under the objective's metric.")
    rules = o.pop("rules", None)
    for key in sorted(o):  # baseline and floor figures, and anything the loop adds
        lines.append(f"{key}: {_fmt(o[key])}")
    if rules:
        lines.append("Rules (the judge enforces them; a candidate that breaks one fails):")
        lines += [f"- {r}" for r in rules]
    if best:
        cid = best.get("candidate_id") or best.get("id")
        us = best.get("candidate_us")
        x, vs = best.get("vs_baseline"), "the baseline candidate"
        if not isinstance(x, (int, float)):
            x, vs = best.get("speedup"), "the judge's baseline"
        lines.append(f"Current best: {cid}, " + (f"{us:.1f} us" if isinstance(us, (int, float)) else "? us")
                     + (f", {x:.2f}x vs {vs}" if isinstance(x, (int, float)) else "") + ". Beat it.")
    else:
        lines.append("Current best: none yet (no candidate has passed the tests and been timed).")
    lines.append(f"Budget: {budget} tool calls in all, {_budget_left(budget, budget_used)} left. Every tool call costs one.")
    if workers > 1:
        lines.append(
            f"Up to {workers} evaluations run at once: the tool calls of one reply run in parallel (each costs one call), so "
            "benchmark several candidates in one reply. A result marked contended was timed beside another evaluation on the "
            "same device: its time is indicative and never becomes the best; benchmark that candidate again in a reply of its "
            "own to time it alone.")
    lines.append(
        "Work like a kernel engineer: write a complete, self-contained candidate file with write_candidate "
        f"(imports only {', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))}; math in @triton.jit kernels; "
        "outputs allocated on the inputs' device), run_tests it, benchmark what passes, profile the best, "
        "and state a prediction in the notes of each candidate."
    )
    return "\n".join(lines)


def _budget_left(budget: int, used: int) -> str:
    """Calls left, rounded down to a twentieth of the budget until the end is near: the system
    message then changes rarely, which keeps providers' prompt caches warm."""
    left = max(budget - used, 0)
    step = max(budget // 20, 1)
    if left < 2 * step:
        return str(left)
    return f"at least {left - left % step}"


def _trim(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n… [{len(text) - limit} characters trimmed] …\n{text[-tail:]}"


def _parse_arguments(raw: Any) -> tuple[dict | None, str | None]:
    """(arguments, error): a model's tool-call arguments must be a JSON object."""
    if isinstance(raw, dict):
        return raw, None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    try:
        args = json.loads(raw)
    except (TypeError, ValueError) as exc:
        return None, f"the arguments are not valid JSON ({exc}); nothing was run. Send a JSON object."
    if not isinstance(args, dict):
        return None, f"the arguments must be a JSON object, got {type(args).__name__}; nothing was run."
    return args, None


class _Issued:
    """A call of a reply issued and not yet answered: its number."""

    def __init__(self, number: int):
        self.number = number


class LLMAgent(Agent):
    """Drives a chat-completions endpoint with tool calls; one request (and its calls) per ``act``."""

    name = "openai"

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        context_tokens: int | str = 0,
        request_timeout: float | str = 600.0,
        seed: int | None = None,
        max_retries: int | None = None,
        pause_s: float | None = None,
        max_pauses: int | None = None,
        max_idle_turns: int = 3,
        max_malformed: int = 3,
        max_result_chars: int = 12_000,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not model:
            raise ValueError("the openai agent needs a model name: --kopt-model=NAME (or kopt_model in the ini file)")
        self.model = model
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = os.environ.get(api_key_env or "OPENAI_API_KEY") or None
        if key is None:
            if base_url is None:
                raise ValueError(f"no API key: set ${api_key_env}, or point --kopt-base-url at a self-hosted server")
            key = "EMPTY"  # self-hosted servers (vLLM, llama.cpp) take any key
        self._secret = key if key != "EMPTY" else None  # only to scrub it from what is logged
        register_secret(self._secret)  # the log, result files and everything built from them never hold it
        if self._secret and scrub_env({api_key_env: key}):
            # The judge strips variables named like secrets from candidates' environment; this
            # name would slip through, so the variable leaves this process (the client has the key).
            os.environ.pop(api_key_env, None)
        self.base_url = base_url
        # What the loop records in run_started/run_resumed and reuses on --kopt-resume: the
        # variable's name, never the key. context_tokens as given (0: the model's default).
        self.settings = {
            "model": model, "base_url": self._scrub(base_url), "api_key_env": api_key_env or "OPENAI_API_KEY",
            "context_tokens": int(context_tokens or 0), "request_timeout": float(request_timeout),
        }
        self.context_tokens = int(context_tokens or 0) or default_context_tokens(model)
        self.seed = seed
        max_retries = int(_setting(max_retries, "KOPT_LLM_RETRIES", DEFAULT_RETRIES))
        self.pause_s = float(_setting(pause_s, "KOPT_LLM_PAUSE_S", DEFAULT_PAUSE_S))
        self.max_pauses = int(_setting(max_pauses, "KOPT_LLM_PAUSES", DEFAULT_PAUSES))
        self.max_idle_turns = int(max_idle_turns)
        self.max_malformed = max(1, int(max_malformed))
        self._warned_context = False
        self.max_result_chars = int(max_result_chars)
        self._sleep = sleep
        self._client = openai.OpenAI(api_key=key, base_url=base_url, timeout=float(request_timeout), max_retries=max_retries)
        self._reset()

    # ---- state --------------------------------------------------------------------------
    def _reset(self) -> None:
        self.messages: list[dict] = []  # the conversation since the last compaction, system excluded
        self._logged = 0  # messages[:_logged] are in the log already
        self._usage_tokens: int | None = None  # server-reported size of the conversation ...
        self._usage_at = 0  # ... when it was len(messages) long
        self._pending: list[tuple[dict, int | None]] = []  # the last reply's calls not yet answered
        self._idle = 0  # consecutive replies without a usable tool call
        self._malformed = 0  # consecutive replies with tool calls, none of them usable
        self._system_logged: str | None = None

    def restore(self, events: list[dict]) -> None:
        """Rebuild the conversation from the log: last compaction, then requests and replies."""
        self._reset()
        last_reply: dict | None = None
        after_reply: list[dict] = []  # tool_call/tool_result events after the last reply
        for event in events:
            kind = event.get("kind")
            if kind in (ev.COMPACTION, ev.LLM_REQUEST) and last_reply is not None:
                # the previous reply's turn was complete: its results are in this event's messages
                self._count(last_reply.get("message") or {})
                last_reply, after_reply = None, []
            if kind == ev.COMPACTION:
                self.messages = [self._memory_message(event.get("memory", ""))]
                self._usage_tokens = None
            elif kind == ev.LLM_REQUEST:
                self.messages.extend(event.get("messages") or [])
                if event.get("system") is not None:
                    self._system_logged = event["system"]
            elif kind == ev.LLM_RESPONSE and event.get("message") is not None:
                self.messages.append(event["message"])
                last_reply, after_reply = event, []
                usage = event.get("usage") or {}
                if usage.get("total_tokens"):
                    self._usage_tokens, self._usage_at = int(usage["total_tokens"]), len(self.messages)
            elif kind in (ev.TOOL_CALL, ev.TOOL_RESULT) and last_reply is not None:
                after_reply.append(event)
        self._logged = len(self.messages)
        if last_reply is not None:
            # The crash came after the reply but before the next request: finish the turn.
            self._after_reply(last_reply["message"], after_reply)
        if self._idle >= self.max_idle_turns or self._malformed >= self.max_malformed:  # it had stopped; a resumed
            self._idle = self._malformed = 0  # run gives it another turn
            self.messages.append({"role": "user", "content": NUDGE})

    def _memory_message(self, memory: str) -> dict:
        return {"role": "user", "content": memory + CONTINUE}

    def _usable_calls(self, reply_event: dict) -> bool:
        calls = (reply_event.get("message") or {}).get("tool_calls") or []
        return any(_parse_arguments((c.get("function") or {}).get("arguments"))[1] is None for c in calls)

    def _count(self, message: dict) -> None:
        """Keep the two streaks a reply ends or extends: without a usable call, and all calls malformed."""
        usable = self._usable_calls({"message": message})
        self._idle = 0 if usable else self._idle + 1
        self._malformed = self._malformed + 1 if message.get("tool_calls") and not usable else 0

    def _after_reply(self, message: dict, recorded: list[dict]) -> None:
        """Queue the reply's tool calls, answering from ``recorded`` results those already run."""
        calls = message.get("tool_calls") or []
        if not calls:
            self._count(message)
            if self._idle < self.max_idle_turns:
                self.messages.append({"role": "user", "content": NUDGE})
            return
        results = {}
        open_calls: dict[Any, str] = {}
        for event in recorded:
            if event.get("kind") == ev.TOOL_CALL:
                open_calls[event.get("call")] = event.get("tool")
            elif event.get("kind") == ev.TOOL_RESULT and event.get("call") in open_calls:
                results[event.get("call")] = event
        started = list(open_calls)  # in the order they were issued (the reply's order)
        self._pending = []
        for c in calls:  # each call of the reply, malformed ones too, is one logged tool call, in order
            call_no = started.pop(0) if started else None
            if call_no in results:
                self.messages.append(self._tool_message(c, results[call_no].get("result")))
            else:
                self._pending.append((c, call_no))  # call_no: in flight at the crash
        self._count(message)

    # ---- one step -----------------------------------------------------------------------
    def act(self, tools: Any) -> bool:
        if not self.messages:
            self.messages.append({"role": "user", "content": START})
        if self._pending:
            self._dispatch(tools)
            return True
        if self._malformed >= self.max_malformed:
            text = (f"the model sent {self._malformed} replies in a row whose tool calls were all malformed (arguments that are "
                    "not a JSON object); the run stops here (a resume gives it another turn; --kopt-max-malformed sets the limit)")
            tools.log.append(ev.NOTE, text=text)
            raise ModelMisbehaving(text)
        if self._idle >= self.max_idle_turns:
            tools.log.append(ev.NOTE, text=f"the model sent {self._idle} replies in a row without a usable tool call; the agent stops")
            return False
        if self.context_estimate(tools) > self.context_tokens and len(self.messages) > 1:
            self.compact(tools, reason="context")
        reply = self._request(tools)
        self.messages.append(reply)
        self._logged = len(self.messages)
        self._after_reply(reply, [])
        if self._pending:
            self._dispatch(tools)
        return True

    def _dispatch(self, tools: Any) -> None:
        """Issue every pending call of the reply in order (evaluations run at once, up to the workers), then
        answer them in the reply's order."""
        answers: list[tuple[dict, Any]] = []  # (call, its result or its number while in flight)
        submit = getattr(tools, "submit", None)
        try:
            for c, in_flight in self._pending:
                fn = c.get("function") or {}
                name = fn.get("name") or ""
                args, error = _parse_arguments(fn.get("arguments"))
                redone = self._redone_result(tools, in_flight) if in_flight is not None else None
                if redone is not None:
                    answers.append((c, redone))  # the loop redid the call a crash interrupted: not charged again
                elif error is not None:  # charged like any call that fails, and logged with its error
                    answers.append((c, tools.reject(name, f"{name or 'tool call'}: {error}", raw=fn.get("arguments"))))
                else:
                    for hidden in HIDDEN_ARGS.get(name, ()):
                        args.pop(hidden, None)
                    if name == "write_candidate":
                        args["strategy"] = "llm"
                    # BudgetExhausted propagates: the loop answers what is in flight and ends the run
                    answers.append((c, _Issued(submit(name, **args)) if submit else tools.call(name, **args)))
        finally:
            if len(answers) < len(self._pending):  # stopped part-way: what was issued is in the log, a resume goes on from it
                self._pending = self._pending[len(answers):]
        for c, answer in answers:
            result = tools.result_of(answer.number) if isinstance(answer, _Issued) else answer
            self.messages.append(self._tool_message(c, result))
        self._pending = []

    @staticmethod
    def _redone_result(tools: Any, call_no: int) -> Any:
        for event in reversed(read_events(tools.log.path)):
            if event.get("kind") == ev.TOOL_RESULT and event.get("call") == call_no:
                return event.get("result")
        return None

    def _tool_message(self, call: dict, result: Any) -> dict:
        """A tool result as the model reads it: JSON, with any source file shown as code (a file
        the model asked to see is trimmed only past SOURCE_RESULT_CHARS)."""
        limit = self.max_result_chars
        if isinstance(result, dict) and isinstance(result.get("source"), str):
            rest = {k: v for k, v in result.items() if k != "source"}
            text = json.dumps(rest, ensure_ascii=False, sort_keys=True) + "\nsource:\n```python\n" + result["source"] + "\n```"
            limit = max(limit, SOURCE_RESULT_CHARS)
        else:
            text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, sort_keys=True)
        return {"role": "tool", "tool_call_id": call.get("id") or "", "content": _trim(text, limit)}

    # ---- context ------------------------------------------------------------------------
    def system_message(self, tools: Any) -> str:
        return render_objective(tools.objective, tools.best, tools.budget_used, tools.budget, int(getattr(tools, "workers", 1) or 1))

    def context_estimate(self, tools: Any) -> int:
        """Tokens the next request will carry: the server's last count plus an estimate of what came after."""
        system = estimate_tokens(self.system_message(tools)) + estimate_tokens(tool_specs(tools.SCHEMAS))
        if self._usage_tokens is not None and self._usage_at <= len(self.messages):
            return self._usage_tokens + estimate_tokens(self.messages[self._usage_at:])
        return system + estimate_tokens(self.messages)

    def compact(self, tools: Any, *, reason: str) -> str:
        """Replace the conversation by the log's compact memory, recorded as a ``compaction`` event."""
        memory = build_memory(read_events(tools.log.path), tools.run_dir)
        tools.log.append(
            ev.COMPACTION, memory=memory, source="log", reason=reason,
            tokens_before=self.context_estimate(tools), messages_dropped=len(self.messages),
        )
        floor = estimate_tokens(self.system_message(tools)) + estimate_tokens(tool_specs(tools.SCHEMAS)) + estimate_tokens(memory)
        if floor > self.context_tokens and not self._warned_context:
            self._warned_context = True
            warning = (f"warning: the context budget ({self.context_tokens} tokens) is smaller than the objective and the run's memory "
                       f"(~{floor} tokens), so every request is compacted first; raise --kopt-context-tokens if the server allows it")
            if hasattr(tools, "note"):
                tools.note(warning)
            else:
                tools.log.append(ev.NOTE, text=warning)
        self.messages = [self._memory_message(memory)]
        self._logged = 1
        self._usage_tokens, self._usage_at = None, 0
        return memory

    # ---- the endpoint ---------------------------------------------------------------------
    def _scrub(self, value: Any) -> Any:
        if self._secret and isinstance(value, str):
            return scrub(value)
        return value

    def _request(self, tools: Any) -> dict:
        """One chat completion, logged; pauses and retries on transient failure."""
        compacted_for_length = False
        pauses = 0
        first_failure: float | None = None
        while True:
            system = self.system_message(tools)
            delta = self.messages[self._logged:]
            tools.log.append(
                ev.LLM_REQUEST, model=self.model, messages=delta,
                system=system if system != self._system_logged else None,
                n_messages=len(self.messages) + 1, estimated_tokens=self.context_estimate(tools),
            )
            self._system_logged = system
            self._logged = len(self.messages)
            request: dict[str, Any] = {
                "model": self.model,
                "messages": [{"role": "system", "content": system}, *self.messages],
                "tools": tool_specs(tools.SCHEMAS),
            }
            if self.seed is not None:
                request["seed"] = int(self.seed)
            started = time.monotonic()
            try:
                completion = self._client.chat.completions.create(**request)
            except openai.BadRequestError as exc:
                text = self._scrub(str(exc))
                tools.log.append(ev.LLM_RESPONSE, model=self.model, message=None, error=text, status=400, duration_s=time.monotonic() - started)
                lowered = text.lower()
                if self.seed is not None and "seed" in lowered:  # some hosted endpoints refuse the parameter
                    self.seed = None
                    tools.log.append(ev.NOTE, text="the endpoint refused the seed parameter; requests go without it from now on")
                    continue
                if not compacted_for_length and "context" in lowered and ("length" in lowered or "token" in lowered) and len(self.messages) > 1:
                    compacted_for_length = True
                    self.compact(tools, reason="context length error")
                    continue
                raise EndpointError(f"the endpoint rejected the request: {text}") from None
            except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError, openai.APIStatusError) as exc:
                status = getattr(exc, "status_code", None)
                text = self._scrub(f"{type(exc).__name__}: {exc}")
                tools.log.append(ev.LLM_RESPONSE, model=self.model, message=None, error=text, status=status, duration_s=time.monotonic() - started)
                transient = status is None or status in (408, 409, 429) or status >= 500
                if not transient:
                    raise EndpointError(
                        f"the endpoint {self.base_url or 'api.openai.com'} refused the request ({text}); "
                        "check the model name and API key, then resume the run"
                    ) from None
                first_failure = started if first_failure is None else first_failure
                if pauses >= self.max_pauses:
                    raise EndpointUnavailable(
                        f"the endpoint {self.base_url or 'api.openai.com'} failed {pauses + 1} times in "
                        f"{time.monotonic() - first_failure:.0f} s ({text}); the run stopped here and can be resumed"
                    ) from None
                self._sleep(min(self.pause_s * 2**pauses, 600.0))
                pauses += 1
                continue
            return self._record_reply(tools, completion, time.monotonic() - started)

    def _record_reply(self, tools: Any, completion: Any, duration: float) -> dict:
        choice = completion.choices[0] if completion.choices else None
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if choice is not None and choice.message is not None:
            m = choice.message
            message["content"] = self._scrub(m.content)
            calls = []
            for n, tc in enumerate(m.tool_calls or []):
                fn = getattr(tc, "function", None)
                arguments = getattr(fn, "arguments", None) or ""
                if not isinstance(arguments, str):  # some servers send an object, not its JSON text
                    arguments = json.dumps(arguments, ensure_ascii=False)
                calls.append({
                    "id": getattr(tc, "id", None) or f"call_{tools.log.seq + 1}_{n}",  # a few servers omit ids
                    "type": "function",
                    # scrubbed here, before anything reads them: notes, sources and replays never hold the key
                    "function": {"name": self._scrub(getattr(fn, "name", None) or ""), "arguments": self._scrub(arguments)},
                })
            if calls:
                message["tool_calls"] = calls
        usage = completion.usage.model_dump() if getattr(completion, "usage", None) is not None else None
        tools.log.append(
            ev.LLM_RESPONSE, model=getattr(completion, "model", None) or self.model, message=message, usage=usage,
            finish_reason=getattr(choice, "finish_reason", None), duration_s=duration,
        )
        if usage and usage.get("total_tokens"):
            self._usage_tokens, self._usage_at = int(usage["total_tokens"]), len(self.messages) + 1
        else:
            self._usage_tokens = None
        return message
