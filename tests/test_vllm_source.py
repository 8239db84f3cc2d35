"""Every call the vLLM engine makes, held to the source of the released vLLM 0.33.0 (CI).

No machine of this project can run vLLM's GPU path (Model Runner V2), and vLLM's CPU build, where
there is one, runs another sampler with other limits. What can be checked everywhere is the
engine's code against vLLM's own: each method it calls on ``LLM`` exists there and takes the
arguments given, each ``SamplingParams`` and ``LLM(...)`` keyword is a field vLLM declares, each
literal it passes (a logprobs mode, a weight-transfer backend, a LoRA rank, a wake-up tag, an IPC
update's fields) is one vLLM accepts, and the caps in ``vllm_limits.py`` are the ones vLLM 0.33.0
declares. Both sides are read with :mod:`ast`; nothing of vLLM is imported.

``scripts/vllm_source.sh`` fetches the wheel's Python files (once, into
``~/.cache/ftis-flwr/vllm-0.33.0``) and runs this file; ``.ci/run`` calls it. Without those files
every test here is skipped, naming the script.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from ftis_flwr.node.engines import vllm as engine_module
from ftis_flwr.node.engines import vllm_memory, vllm_weights
from ftis_flwr.node.engines.vllm_limits import VLLM_033_LIMITS, request_fields

SOURCE = Path(os.environ.get("FTIS_VLLM_SOURCE", Path.home() / ".cache" / "ftis-flwr" / "vllm-0.33.0"))
pytestmark = pytest.mark.skipif(not (SOURCE / "vllm" / "entrypoints" / "llm.py").is_file(),
                                reason=f"no vLLM 0.33.0 source at {SOURCE}: run scripts/vllm_source.sh")
ENGINE = Path(engine_module.__file__)


# ------------------------------------------------------------------ reading vLLM's source
class VllmSource:
    """vLLM's modules as syntax trees: classes with their bases (followed through ``from vllm...
    import``), methods, declared fields, module constants and ``Literal`` aliases."""

    def __init__(self, root: Path):
        self.root = root
        self._trees: dict[str, ast.Module] = {}

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            base = self.root / module.replace(".", "/")
            path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
            self._trees[module] = ast.parse(path.read_text(), filename=str(path))
        return self._trees[module]

    def _imported(self, module: str, name: str) -> str | None:
        for node in self.tree(module).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm"):
                if any((a.asname or a.name) == name for a in node.names):
                    return node.module
        return None

    def cls(self, module: str, name: str) -> tuple[str, ast.ClassDef]:
        for node in ast.walk(self.tree(module)):
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        origin = self._imported(module, name)
        if origin is None:
            raise LookupError(f"class {name} not found in {module}")
        return self.cls(origin, name)

    def lineage(self, module: str, name: str) -> list[tuple[str, ast.ClassDef]]:
        """The class and every base found in vLLM's source, the class first."""
        found = [self.cls(module, name)]
        for base in found[0][1].bases:
            if isinstance(base, ast.Subscript):  # Generic[...] of a vLLM class
                base = base.value
            if isinstance(base, ast.Name):
                try:
                    found += self.lineage(found[0][0], base.id)
                except LookupError:  # typing, msgspec, pydantic: not vLLM's
                    continue
        return found

    def methods(self, module: str, name: str) -> dict[str, ast.FunctionDef]:
        out: dict[str, ast.FunctionDef] = {}
        for _, node in reversed(self.lineage(module, name)):  # a subclass's method wins
            out.update({f.name: f for f in node.body if isinstance(f, ast.FunctionDef)})
        return out

    def fields(self, module: str, name: str) -> dict[str, bool]:
        """Declared fields (annotated class attributes) -> whether each has a default."""
        out: dict[str, bool] = {}
        for _, node in reversed(self.lineage(module, name)):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    if "ClassVar" not in ast.unparse(item.annotation):
                        out[item.target.id] = item.value is not None
        return out

    def constant(self, module: str, name: str):
        for node in ast.walk(self.tree(module)):
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                getattr(node, "target", None) if isinstance(node, ast.AnnAssign) else None
            if isinstance(target, ast.Name) and target.id == name and isinstance(node.value, ast.Constant):
                return node.value.value
        raise LookupError(f"{name} not found as a constant in {module}")

    def literal(self, module: str, name: str) -> set:
        """The values of ``name = Literal[...]`` in ``module``."""
        for node in self.tree(module).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return literal_values(node.value)
        raise LookupError(f"{name} not found as a Literal alias in {module}")


def literal_values(annotation: ast.AST) -> set:
    """Every value inside any ``Literal[...]`` of an annotation (``Literal[...] | str`` too)."""
    values: set = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Literal"):
            inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            values |= {e.value for e in inner if isinstance(e, ast.Constant)}
    return values


def refusal(func: ast.FunctionDef, positional: int, keywords: set[str]) -> str:
    """Why a call with ``positional`` arguments and these keywords fails this signature, or ""."""
    args = func.args
    names = [a.arg for a in args.posonlyargs + args.args]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    if positional > len(names) and args.vararg is None:
        return f"{positional} positional arguments, {func.name}() takes {len(names)}"
    takes = set(names[len(args.posonlyargs):]) | {a.arg for a in args.kwonlyargs}
    unknown = sorted(k for k in keywords if k not in takes)
    if unknown and args.kwarg is None:
        return f"{func.name}() has no parameter {', '.join(unknown)}"
    return ""


@pytest.fixture(scope="module")
def vllm_src() -> VllmSource:
    return VllmSource(SOURCE)


# ------------------------------------------------------------------ reading the engine's code
def dotted(node: ast.AST) -> str:
    return f"{dotted(node.value)}.{node.attr}" if isinstance(node, ast.Attribute) else \
        node.id if isinstance(node, ast.Name) else "?"


def engine_calls(prefix: str) -> list[ast.Call]:
    """Every call in the engine's module on ``prefix.<method>`` (e.g. ``self.llm``)."""
    tree = ast.parse(ENGINE.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and dotted(n.func.value) == prefix]


def keywords(call: ast.Call) -> set[str]:
    return {k.arg for k in call.keywords if k.arg is not None}


def dict_keys(node: ast.AST) -> set[str]:
    """String keys of a ``{...}`` literal or ``dict(k=...)`` call."""
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys if isinstance(k, ast.Constant)}
    if isinstance(node, ast.Call) and dotted(node.func) == "dict":
        return keywords(node)
    return set()


def engine_llm_kwargs() -> set[str]:
    """Every keyword the engine can pass to ``vllm.LLM(**kwargs)``: the ``kwargs`` dict it builds,
    its item assignments and updates, and what :func:`plan_gpu_memory` returns into it."""
    tree = ast.parse(ENGINE.read_text())
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id == "kwargs" and node.value is not None:
                    keys |= dict_keys(node.value)
                if isinstance(t, ast.Subscript) and dotted(t.value) == "kwargs" and isinstance(t.slice, ast.Constant):
                    keys.add(t.slice.value)
        if isinstance(node, ast.Call) and dotted(node.func) == "kwargs.update":
            keys |= keywords(node)
            for arg in node.args:
                if isinstance(arg, ast.Call) and dotted(arg.func) == "plan_gpu_memory":
                    keys |= returned_keys(Path(vllm_memory.__file__), "plan_gpu_memory")
    return keys


def returned_keys(path: Path, function: str) -> set[str]:
    tree = ast.parse(path.read_text())
    func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    return set().union(*(dict_keys(r.value) for r in ast.walk(func) if isinstance(r, ast.Return) and r.value))


# ------------------------------------------------------------------ the checks
LLM = ("vllm.entrypoints.llm", "LLM")
CALLED_ON_LLM = {"generate", "sleep", "wake_up", "collective_rpc", "reset_prefix_cache", "apply_model",
                 "init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update"}


def test_the_request_caps_are_the_ones_vllm_declares(vllm_src):
    """vllm_limits.py's caps, each read from the file and constant vLLM 0.33.0 declares it in."""
    declared = {
        "allowed_token_ids": vllm_src.constant("vllm.v1.worker.gpu.sample.logit_bias", "MAX_NUM_ALLOWED_TOKEN_IDS"),
        "logit_bias": vllm_src.constant("vllm.v1.worker.gpu.sample.logit_bias", "MAX_NUM_LOGIT_BIAS_TOKENS"),
        "stop_token_ids_with_min_tokens": vllm_src.constant("vllm.v1.worker.gpu.sample.logit_bias",
                                                            "MAX_NUM_STOP_TOKEN_IDS"),
        "logprob_token_ids": vllm_src.constant("vllm.sampling_params", "MAX_LOGPROB_TOKEN_IDS"),
        "bad_words": vllm_src.constant("vllm.envs", "VLLM_MAX_NUM_BAD_WORDS"),
        "bad_words_total_tokens": vllm_src.constant("vllm.envs", "VLLM_MAX_BAD_WORDS_TOTAL_TOKENS"),
    }
    _, model_config = vllm_src.cls("vllm.config.model", "ModelConfig")
    max_logprobs = next(i for i in model_config.body if isinstance(i, ast.AnnAssign)
                        and getattr(i.target, "id", "") == "max_logprobs")
    declared["logprobs"] = next(k.value.value for k in max_logprobs.value.keywords if k.arg == "default")
    assert declared == VLLM_033_LIMITS


def test_every_sampling_params_keyword_is_a_field_vllm_declares(vllm_src):
    """request_fields and every keyword the engine adds on top (``self._params(...)``) are fields of
    vLLM's SamplingParams: a renamed or removed field would fail every request."""
    fields = vllm_src.fields("vllm.sampling_params", "SamplingParams")
    sent = set(request_fields([1]))
    calls = engine_calls("self")
    params = [c for c in calls if c.func.attr == "_params"]
    assert params, "the engine builds no request through self._params"
    for call in params:
        sent |= keywords(call)
    assert {"n", "temperature", "top_k", "top_p", "max_tokens", "logprobs", "seed"} <= sent
    assert sorted(sent - set(fields)) == []


def test_every_keyword_the_engine_passes_to_llm_is_one_vllm_takes(vllm_src):
    """``vllm.LLM(**kwargs)``: each key is a parameter of LLM.__init__ or a field of EngineArgs
    (where LLM's ``**kwargs`` go)."""
    init = vllm_src.methods(*LLM)["__init__"]
    takes = {a.arg for a in init.args.args + init.args.kwonlyargs}
    engine_args = vllm_src.fields("vllm.engine.arg_utils", "EngineArgs")
    sent = engine_llm_kwargs()
    assert {"model", "dtype", "enable_lora", "max_lora_rank", "enable_sleep_mode", "weight_transfer_config",
            "gpu_memory_utilization", "kv_cache_memory_bytes"} <= sent
    assert sorted(k for k in sent if k not in takes and k not in engine_args) == []


def test_every_method_the_engine_calls_on_llm_exists_with_those_arguments(vllm_src):
    """Each ``self.llm.<method>(...)`` (mixins followed) and ``self.llm.llm_engine.<method>(...)``."""
    methods = vllm_src.methods(*LLM)
    calls = engine_calls("self.llm")
    assert {c.func.attr for c in calls} >= CALLED_ON_LLM
    wrong = [f"line {c.lineno}: {c.func.attr}: " + (refusal(methods[c.func.attr], len(c.args), keywords(c))
                                                    if c.func.attr in methods else "no such method on LLM")
             for c in calls]
    engine = vllm_src.methods("vllm.v1.engine.llm_engine", "LLMEngine")
    for c in engine_calls("self.llm.llm_engine"):
        wrong.append(f"line {c.lineno}: llm_engine.{c.func.attr}: " + (
            refusal(engine[c.func.attr], len(c.args), keywords(c)) if c.func.attr in engine else "no such method"))
    assert [w for w in wrong if not w.endswith(": ")] == []


def test_the_file_sync_reloads_through_a_worker_method_that_takes_its_arguments(vllm_src):
    """``collective_rpc("reload_weights", kwargs=...)``: both GPU model runners (the old one and
    Model Runner V2) take the keywords sent."""
    rpc = [c for c in engine_calls("self.llm") if c.func.attr == "collective_rpc"]
    reload = next(c for c in rpc if isinstance(c.args[0], ast.Constant) and c.args[0].value == "reload_weights")
    sent = dict_keys(next(k.value for k in reload.keywords if k.arg == "kwargs"))
    assert sent == {"weights_path", "is_checkpoint_format"}
    assert "reload_weights" in vllm_src.methods("vllm.v1.worker.gpu_worker", "Worker")
    for module, runner in (("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
                           ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")):
        assert refusal(vllm_src.methods(module, runner)["reload_weights"], 0, sent) == "", module


def test_each_literal_the_engine_passes_is_one_vllm_accepts(vllm_src):
    """The logprobs mode, the weight-transfer backend, the LoRA rank buckets and the wake-up tags."""
    text = ENGINE.read_text()
    assert 'logprobs_mode="processed_logprobs"' in text
    assert "processed_logprobs" in vllm_src.literal("vllm.config.model", "LogprobsMode")
    _, transfer = vllm_src.cls("vllm.config.weight_transfer", "WeightTransferConfig")
    backend = next(i for i in transfer.body if isinstance(i, ast.AnnAssign) and i.target.id == "backend")
    assert '{"backend": "ipc"}' in text and "ipc" in literal_values(backend.annotation)
    ranks = vllm_src.literal("vllm.config.lora", "MaxLoRARanks")
    assert {engine_module._lora_rank_bucket(r) for r in range(1, max(ranks) + 1)} == ranks
    wake = [c for c in engine_calls("self.llm") if c.func.attr == "wake_up" and c.keywords]
    tags = {e.value for c in wake for e in next(k.value for k in c.keywords if k.arg == "tags").elts}
    assert tags == {"weights", "kv_cache"}
    worker_wake = ast.unparse(vllm_src.methods("vllm.v1.worker.gpu_worker", "Worker")["wake_up"])
    assert all(f"'{t}' in tags" in worker_wake for t in tags), worker_wake


def test_the_ipc_update_carries_the_fields_vllm_s_ipc_backend_reads(vllm_src):
    """``ipc_update_info``'s keys are fields of IPCWeightTransferUpdateInfo and cover every field
    without a default; the init request's are IPCWeightTransferInitInfo's; both reach the worker
    under the keys vLLM's offline mixin reads."""
    module = "vllm.distributed.weight_transfer.ipc_engine"
    update = vllm_src.fields(module, "IPCWeightTransferUpdateInfo")
    sent = returned_keys(Path(vllm_weights.__file__), "ipc_update_info")
    assert sent and sent <= set(update) and {f for f, has_default in update.items() if not has_default} <= sent
    init = [c for c in engine_calls("self.llm") if c.func.attr == "init_weight_transfer_engine"][0]
    request = init.args[0]
    assert dict_keys(request) == {"init_info"}
    init_info = request.values[0]
    assert dict_keys(init_info) <= set(vllm_src.fields(module, "IPCWeightTransferInitInfo"))
    mixin = ast.unparse(vllm_src.methods(*LLM)["update_weights"]) + ast.unparse(
        vllm_src.methods(*LLM)["init_weight_transfer_engine"])
    assert "request['update_info']" in mixin and "request['init_info']" in mixin


def test_a_lora_request_is_built_with_vllm_s_field_order(vllm_src):
    """``LoRARequest(name, int_id, path)`` positionally: vLLM's first three fields, in that order."""
    calls = [n for n in ast.walk(ast.parse(ENGINE.read_text()))
             if isinstance(n, ast.Call) and dotted(n.func).endswith("lora.request.LoRARequest")]
    assert calls and all(len(c.args) == 3 and not c.keywords for c in calls)
    assert list(vllm_src.fields("vllm.lora.request", "LoRARequest"))[:3] == ["lora_name", "lora_int_id", "lora_path"]
