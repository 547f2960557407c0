"""Hostile and broken candidates through the whole judge, each rejected for the right reason.

Most are variations of ``tests/hostile/good_axpy.py`` on a toy problem registered by this
module only (``judge_toy_problem``), which also proves the child finds a problem the parent
registered. Every evaluation is an independent child process, so they run concurrently in one
module-scoped fixture; the tests then read the results. ``*_runtime`` entries switch the static
policy off to prove the runtime checks stand on their own (the policy is bypassable by
computed names).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import judge_toy_problem
from pytest_kopt.judge import STAGES, evaluate

HOSTILE = Path(__file__).resolve().parent / "hostile"
FAMILIES = Path(__file__).resolve().parent.parent / "kernels" / "families"
TOY = judge_toy_problem.AXPY.name
ON_GPU = torch.cuda.is_available()


@dataclass(frozen=True)
class Expect:
    path: Path
    stage: str
    reasons: tuple[str, ...] = ()  # each must appear in the joined reasons
    problem: str = TOY
    options: dict = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return "pass" if not self.reasons else "fail"


def hostile(name: str, stage: str, *reasons: str, problem: str = TOY, **options) -> Expect:
    return Expect(HOSTILE / f"{name}.py", stage, reasons, problem, options)


EXPECT = {
    # controls: honest candidates pass
    "good_axpy": hostile("good_axpy", "benchmark", upto="benchmark"),
    "kda_baseline": Expect(FAMILIES / "kda_recurrent.py", "correctness", problem="kda"),
    "mla_baseline": Expect(FAMILIES / "mla_naive.py", "correctness", problem="mla"),
    # static policy
    "forbidden_import": hostile("forbidden_import", "policy", "flash_attn", "third-party kernel libraries"),
    "calls_reference": hostile("calls_reference", "policy", "kernels.reference.kda", "project's own references", problem="kda"),
    "getattr_einsum": hostile("getattr_einsum", "policy", "line 19", "computed attribute name"),
    "patches_harness": hostile("patches_harness", "policy", "assigning to torch.allclose"),
    "tensor_subclass": hostile("tensor_subclass", "policy", "defining __torch_function__ is not allowed"),
    # runtime honesty checks
    # torch math on the host: refused by the runner's fence at its first call (fence.py); the dispatch guard behind it
    # is tested on its own in tests/test_judge_checks.py
    "pure_torch": hostile("pure_torch", "compile", "FencedOp", "Tensor.__rmul__ is torch math"),
    "empty_output": hostile("empty_output", "correctness", "200 of 200 elements were never written (uninitialised memory)"),
    "caches_results": hostile("caches_results", "correctness", "second call: new data at the same addresses", "not allocated during this call"),
    # inputs are read-only memory in the runner: writing one is a fault, named as such
    "mutates_inputs": hostile("mutates_inputs", "compile", *(("input",) if ON_GPU else ("SIGSEGV", "inputs are mapped read-only"))),
    "returns_nan": hostile("returns_nan", "correctness", "out: contains NaN or Inf"),
    "fast_later": hostile("fast_later", "benchmark", "timed eager call", "every timed output is checked", upto="benchmark"),
    "small_shapes_only": hostile("small_shapes_only", "correctness", "minimal failing shape found by hypothesis", quick=False),
    # runtime checks without the policy's help
    "getattr_einsum_runtime": hostile("getattr_einsum", "compile", "torch.einsum is torch math", static_policy=False),
    # patching the runner's torch changes nothing the verdict depends on (the supervisor compares), and the runner's
    # audit of torch and its own modules names the change
    "patches_harness_runtime": hostile("patches_harness", "compile", "the candidate replaced torch.Tensor.norm, torch.allclose",
                                       static_policy=False),
    # (as_subclass is outside the fence's allow-list; tests/test_judge_transport.py checks the store's own refusal of a
    # subclass)
    "tensor_subclass_runtime": hostile("tensor_subclass", "compile", "Tensor.as_subclass", static_policy=False),
    # writes a passing result file, then os._exit(0): nobody reads the runner's files
    "forges_result_runtime": hostile("forges_result", "compile", "exited with code 0 during 'load'", static_policy=False),
    # class 1: reaching the judge from inside the process (the policy stops the chain; at run time
    # there is nothing of the judge's to reach: the verdict is decided in another process; the runner's audit names
    # what was replaced)
    "reaches_judge": hostile("reaches_judge", "policy", "is not allowed"),
    "reaches_judge_runtime": hostile("reaches_judge", "compile", "replaced pytest_kopt.judge.checks.inspect_call", static_policy=False),
    # class 2 and 3: planting files for later evaluations, reading the judge's secrets (it computes
    # honestly, so it passes; test_nothing_was_planted checks the files)
    "persists_runtime": hostile("persists", "correctness", static_policy=False),
    "reads_secrets_runtime": hostile("reads_secrets", "correctness", static_policy=False),
    # class 4: stale or memoised outputs while timed (fresh inputs every timed call, every output checked)
    "stale_when_timed": hostile("stale_when_timed", "benchmark", "timed eager call", "every timed output is checked", upto="benchmark"),
    "memo_when_timed": hostile("memo_when_timed", "benchmark", "timed eager call", "every timed output is checked", upto="benchmark"),
    # torch math in the calls the guard does not watch, and math in Python floats (red team, session 49): the runner's
    # fence refuses both, in every call alike, with the policy passed and nothing patched
    "torch_when_timed": hostile("torch_when_timed", "benchmark", "timed eager calls", "FencedOp", "Tensor.__rmul__ is torch math",
                                upto="benchmark"),
    "python_floats": hostile("python_floats", "compile", "Tensor.__float__ reads a float tensor's elements into Python"),
    # the second red team (session 49): a replaced method the runner calls while storing outputs, and torch.ops in
    # timed calls; both refused by the policy, and with it off by the fence
    "patches_store": hostile("patches_store", "policy", "assigning to T.detach"),
    "patches_store_runtime": hostile("patches_store", "compile", "the candidate replaced torch.Tensor.detach (importing it)",
                                     static_policy=False),
    "lu_when_timed": hostile("lu_when_timed", "benchmark", "timed eager calls", "Tensor.lu is torch math", upto="benchmark"),
    # the fifth red team (session 50): code in a string annotation, run by functools.singledispatch's register
    "annotation_exec": hostile("annotation_exec", "policy", "code typing may evaluate", "singledispatch"),
    # the sixth (session 50): gathers through tensor indices when timed (the fence), and Tensor's C base class when
    # timed, which only the policy keeps out; with it off, a timed call that launches no kernel is refused
    "index_when_timed": hostile("index_when_timed", "benchmark", "timed eager calls", "with a tensor or a sequence as index",
                                upto="benchmark"),
    "base_class_when_timed": hostile("base_class_when_timed", "policy", "the module torch._C"),
    # (with the policy off, torch's dispatcher refuses the base class's ops: fence._fence_dispatcher)
    "base_class_when_timed_runtime": hostile("base_class_when_timed", "benchmark", "aten.mul.Tensor is torch math",
                                             "refused in torch's dispatcher", static_policy=False, upto="benchmark"),
    # the seventh (session 51): a module bound to another name reached exec (the policy; with it off, exec called by the
    # candidate is refused at run time), an output whose metaclass claimed it was a tuple was listed outside the fence
    # (checked by identity now, and listed inside), the base class through getattr's literal name (the policy; with it
    # off, the dispatcher)
    "module_as_value": hostile("module_as_value", "policy", "the module enum is used as a value"),
    "module_as_value_runtime": hostile("module_as_value", "compile", "exec(...) called by the candidate", static_policy=False),
    "claims_tuple": hostile("claims_tuple", "compile", "returned a Outputs: it must return a tuple"),
    "getattr_base_class": hostile("getattr_base_class", "policy", "getattr(..., 'mro') is not allowed"),
    # the eighth (session 51): an import inside a function (the policy: top level only; with it off, the audit sees the
    # fence's flag changed), and torch math in a generator's finally run by the garbage collector (the policy refuses
    # yield; at run time a collection is candidate code, tests/test_judge_checks.py)
    "local_import": hostile("local_import", "policy", "imports are allowed at the top level of the file only"),
    "local_import_runtime": hostile("local_import", "compile", "the candidate replaced pytest_kopt.judge.fence's own state",
                                    static_policy=False),
    "finalizer_math": hostile("finalizer_math", "policy", "yield is not allowed"),
    # the ninth (session 51): special methods bound by name, not by def (a finalizer on an output's base, a module hook
    # that answered for a deleted kernel); at run time a call's outputs are released inside the fence, and kernel is
    # read from the module's namespace
    "finalizer_by_name": hostile("finalizer_by_name", "policy", "binding __del__ is not allowed"),
    "finalizer_by_name_runtime": hostile("finalizer_by_name", "correctness", "contains NaN or Inf", static_policy=False),
    "module_hook": hostile("module_hook", "policy", "binding __getattr__ is not allowed", "kernel may only be defined once"),
    "module_hook_runtime": hostile("module_hook", "compile", "defines no kernel(...) function at its top level",
                                   static_policy=False),
    # the tenth (session 51): functions planted on an input by a dataclass's __init__, run by the checks around a
    # checked call (the policy refuses __init__ on anything but self; the runner checks through views of its own)
    "input_hooks": hostile("input_hooks", "policy", "__init__ on anything but self"),
    "input_hooks_runtime": hostile("input_hooks", "correctness", "the candidate set attributes on its inputs (x)",
                                   "relative RMS error", static_policy=False),
    "getattr_base_class_runtime": hostile("getattr_base_class", "benchmark", "refused in torch's dispatcher", static_policy=False,
                                          upto="benchmark"),
    "reexported_original_runtime": hostile("reexported_original", "compile", "torch.conv_tbc is torch math", static_policy=False),
    "aten_when_timed_runtime": hostile("aten_when_timed", "benchmark", "timed eager calls", "torch.ops add is torch math",
                                       static_policy=False, upto="benchmark"),
    # running while something else is timed: a daemon that leaves the runner's process group and
    # session (SIGSTOP of the group misses it), started at import or during a timed round
    "escapes_stop_runtime": hostile("escapes_stop", "compile", "left processes running outside its calls", "after 'load'",
                                    static_policy=False),
    "escapes_when_timed_runtime": hostile("escapes_when_timed", "benchmark", "timed eager calls",
                                          "left processes running outside its calls", "after 'batch'", static_policy=False,
                                          upto="benchmark"),
    # the runner is limited: first for the out-of-memory killer, no core files, files under 1 GiB,
    # processes capped for a dedicated user (it computes honestly only then)
    "limits_probe_runtime": hostile("limits_probe", "correctness", static_policy=False),
    # class 5: a sweep that runs out of time fails (its budget ends 30 s before the evaluation's deadline: about
    # 20 s here, so one or two of the candidate's 10 s stalls)
    "stalls_unseen_runtime": hostile("stalls_unseen", "correctness", "random-shape sweep judged only", "at least 4 are required",
                                     static_policy=False, timeout_s=55.0),
    # class 6 and 7: numerics on stress inputs, and sequences longer than a chunk, on the CPU
    "mla_no_max": Expect(HOSTILE / "mla_no_max.py", "correctness", ("contains NaN or Inf",), "mla"),
    "kda_first_48": Expect(HOSTILE / "kda_first_48.py", "correctness", ("T200", "relative RMS error"), "kda"),
    # faults: the harness carries on
    "hangs": hostile("hangs", "compile", "timed out", timeout_s=25.0),
    # a wild load: the interpreter segfaults, a GPU reports an illegal address
    "crashes": hostile("crashes", "compile", *(("CUDA error",) if ON_GPU else ("SIGSEGV", "candidate line 12"))),
    "raises": hostile("raises", "compile", "KeyError: 'BLOCKS'", "candidate line 15"),
    "compile_error": hostile("compile_error", "compile", "arange's range must be a power of 2", "candidate line 19"),
}


def _run(expect: Expect) -> dict:
    options = {"quick": True, "upto": "correctness", "timeout_s": 300.0, **expect.options}
    return evaluate(expect.problem, expect.path, **options)


SLOW = ("stalls_unseen_runtime", "mla_baseline", "kda_baseline", "kda_first_48", "mla_no_max", "hangs", "small_shapes_only")
# files a persisting candidate would change or create (tests/hostile/persists.py)
PACKAGE = Path(__file__).resolve().parent.parent / "pytest_kopt"
PLANTED = [PACKAGE / "kopt_planted.py", Path(torch.__file__).resolve().parent.parent / "kopt_planted.pth"]
GUARDED = PACKAGE / "problems" / "base.py"


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    import os

    before = GUARDED.read_bytes()
    os.environ["OPENAI_API_KEY"] = "sk-kopt-probe-0123456789"  # reads_secrets must not find it anywhere
    try:
        # the persisting candidate first, alone: every evaluation after it (plainly wrong candidates
        # among them) must be judged as if it had never run
        found = {"persists_runtime": _run(EXPECT["persists_runtime"])}
        order = sorted((k for k in EXPECT if k not in found), key=lambda k: (k not in SLOW, k))  # slow ones first
        with ThreadPoolExecutor(max_workers=3) as pool:
            futures = {name: pool.submit(_run, EXPECT[name]) for name in order}
            found.update({name: future.result() for name, future in futures.items()})
    finally:
        os.environ.pop("OPENAI_API_KEY", None)
    found["_guarded_after"] = GUARDED.read_bytes() == before  # type: ignore[assignment]
    return found


def test_nothing_was_planted(results: dict[str, dict]) -> None:
    """The persisting candidate ran (it passed), and none of its writes landed."""
    assert results["persists_runtime"]["verdict"] == "pass", results["persists_runtime"]["reasons"]
    assert results["_guarded_after"] is True, "the problem's source was changed by a candidate"
    assert not [p for p in PLANTED if p.exists()], "a candidate planted a file"


def test_every_verdict_records_its_isolation(results: dict[str, dict]) -> None:
    for name, result in results.items():
        if name.startswith("_") or result["stage"] == "policy":
            continue
        assert result["isolation"]["level"] in ("uid", "namespace", "process"), name


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_verdict_stage_and_reason(results: dict[str, dict], name: str) -> None:
    expect, result = EXPECT[name], results[name]
    joined = "\n".join(result["reasons"])
    assert (result["verdict"], result["stage"]) == (expect.verdict, expect.stage), joined
    for fragment in expect.reasons:
        assert fragment in joined, joined
    if expect.verdict == "fail":
        assert result["reasons"] and all(isinstance(r, str) and r for r in result["reasons"])


def test_minimal_failing_shape_is_just_past_the_block(results: dict[str, dict]) -> None:
    reasons = results["small_shapes_only"]["reasons"]
    width = int(re.search(r"hypothesis: B\d+ N(\d+)", reasons[0]).group(1))
    assert width > 128, reasons  # the candidate is right up to 128 columns


def test_a_passing_result_carries_the_documented_fields(results: dict[str, dict]) -> None:
    result = results["good_axpy"]
    assert set(result) >= {"verdict", "stage", "reasons", "problem", "candidate", "candidate_id", "device", "duration_s",
                           "errors", "timings", "speedup", "roofline", "profile"}
    assert result["problem"] == TOY and len(result["candidate_id"]) == 12 and result["device"]
    timings = result["timings"]
    assert timings["candidate_us"] > 0 and timings["baselines"]["torch-eager"] > 0 and timings["reference_us"] > 0
    assert timings["compile_s"] > 0
    assert result["speedup"] == pytest.approx(timings["baselines"]["torch-eager"] / timings["candidate_us"])
    roofline = result["roofline"]
    assert roofline["floor_us"] > 0 and roofline["achieved_GBps"] > 0 and 0 < roofline["floor_fraction"] < 1
    assert all(e["ok"] and 0 <= e["rel_rms"] <= e["tolerance"] for e in result["errors"])
    names = [b["name"] for b in result["benchmarks"]]
    if not ON_GPU:  # one clock on the CPU: device is the eager figure, and there are no graphs
        assert [n for n in names if n.startswith("candidate")] == ["candidate[eager]", "candidate[device]"]
    assert {n.split("[")[0] for n in names} == {"candidate", "torch-eager", "reference"}
    figures = timings["figures"]
    assert figures["eager"] == pytest.approx(timings["candidate_us"]) and (figures["graph"] is None) == (not timings["graph_safe"])
    assert result["isolation"]["level"] in ("uid", "namespace", "process")
    assert ON_GPU or any("indicative" in note for note in result["notes"])


def test_errors_report_each_output_against_its_tolerance(results: dict[str, dict]) -> None:
    for name in ("kda_baseline", "mla_baseline"):
        errors = results[name]["errors"]
        outputs = {e["output"] for e in errors}
        assert outputs == ({"o", "final_state"} if name == "kda_baseline" else {"o", "lse"}), errors
        assert all(e["ok"] and e["rel_rms"] <= e["tolerance"] for e in errors)
    nan = results["returns_nan"]["errors"]
    assert nan and not nan[0]["ok"] and nan[0]["rel_rms"] is None  # NaN never passes


def test_stages_are_the_documented_ones(results: dict[str, dict]) -> None:
    assert {r["stage"] for k, r in results.items() if not k.startswith("_")} <= set(STAGES)


requires_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")


@pytest.mark.gpu
@requires_gpu
def test_side_stream_work_is_caught_at_run_time() -> None:
    result = evaluate(TOY, HOSTILE / "side_stream.py", quick=True, upto="correctness", static_policy=False)
    assert (result["verdict"], result["stage"]) == ("fail", "correctness"), result["reasons"]
    assert any("side stream" in reason for reason in result["reasons"])


@pytest.mark.gpu
@requires_gpu
def test_an_illegal_address_does_not_poison_the_next_evaluation() -> None:
    crashed = evaluate(TOY, HOSTILE / "crashes.py", quick=True, upto="correctness")
    assert crashed["verdict"] == "fail"
    assert any(("illegal memory access" in r) or ("CUDA error" in r) for r in crashed["reasons"]), crashed["reasons"]
    after = evaluate(TOY, HOSTILE / "good_axpy.py", quick=True, upto="correctness")
    assert after["verdict"] == "pass", after["reasons"]


def _listen(port: int):
    """A loopback listener on ``port`` that records whether anything connected (None: the port is taken)."""
    import socket
    import threading

    server = socket.socket()
    try:
        server.bind(("127.0.0.1", port))
    except OSError:
        server.close()
        return None, None
    server.listen()
    server.settimeout(0.2)
    seen: list = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                seen.append(server.accept()[1])
            except OSError:
                continue
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return seen, stop


def _sysv_keys() -> set[int]:
    try:
        lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {int(line.split()[0]) for line in lines if line.split()}


def test_the_sandbox_holds_against_an_escaping_candidate() -> None:
    """The red team's escapes, tried by one candidate with the policy off (tests/hostile/escapes_sandbox.py): it
    raises naming any that worked. From outside: no file it tried to write exists, nothing connected to the listener,
    no System V segment of its key is left. At the process level there is nothing to hold (the probe would also remount
    this machine's mounts), so it is not run there."""
    from pytest_kopt.judge.sandbox import choose_level

    level = choose_level()[0]
    if level == "process":
        pytest.skip("the process level does not confine a runner")
    probe = HOSTILE / "escapes_sandbox.py"
    text = probe.read_text()
    port = int(re.search(r"^PORT = (\d+)", text, re.M).group(1))
    key = int(re.search(r"^KEY = (0x[0-9A-Fa-f]+)", text, re.M).group(1), 16)
    planted = [Path(torch.__file__).resolve().parent.parent / "kopt_escape_probe.pth", PACKAGE / "judge" / "kopt_escape_probe.py",
               Path("/dev/kopt_escape_probe"), Path("/tmp/kopt_escape_probe"), Path("/var/tmp/kopt_escape_probe")]
    keys_before = _sysv_keys()
    seen, stop = _listen(port)
    try:
        result = evaluate(TOY, probe, quick=True, upto="correctness", static_policy=False, timeout_s=300.0)
    finally:
        if stop is not None:
            stop.set()
    left = [p for p in planted if p.exists()]
    for path in left:
        path.unlink()
    assert result["isolation"]["level"] == level
    assert (result["verdict"], result["stage"]) == ("pass", "correctness"), result["reasons"]
    assert not left, f"the candidate wrote {left}"
    assert not seen, "the candidate reached the host's loopback network"
    assert key not in _sysv_keys() - keys_before, "the candidate left a System V segment on the host"
