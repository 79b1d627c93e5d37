"""`specdec bench`: plain decoding, each drafter and the peers, interleaved per prompt."""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import asdict, dataclass, field

import torch
from tqdm import tqdm

from specdec.api.generator import SpeculativeGenerator, auto_drafter
from specdec.api.request import GenerationRequest
from specdec.bench.llama_cpp import LlamaCppPeer, parse_peer
from specdec.bench.peers import TransformersPeer
from specdec.bench.roofline import Roofline, measure_roofline
from specdec.bench.tasks import BenchPrompt
from specdec.core.sampling import SamplingParams
from specdec.core.speculation_length import KSetting
from specdec.core.verify import Acceptance
from specdec.drafters import DrafterChoice, make_drafter
from specdec.errors import InvalidParameterError
from specdec.models.sources import zoo
from specdec.models.sources.loading import LoadedModel, load_model, resolve_model_dir
from specdec.pairing.candidates import candidates_for

PLAIN = "plain"


@dataclass
class BenchConfig:
    target: str
    drafters: list[DrafterChoice]  # specs as written are parsed here
    tasks: list[str]
    limit: int
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    k: KSetting = KSetting()
    peers: list[str] = field(default_factory=list)  # "plain", "assisted:MODEL", "lookup"
    device: str = "cpu"
    roofline_buffer_mb: int = 1024  # buffer for the bandwidth measurement; 0 skips the roofline
    weights: str = "auto"  # the target's weight format (ours; transformers peers run `dtype` weights)
    dtype: str = "float32"  # activations and float weights, ours and the transformers peers' (bfloat16 on GPUs)
    cuda_graphs: bool = True  # ours on a GPU: replay decode and verify forwards as CUDA graphs
    backend: str = "auto"  # ours: auto, native or transformers
    # sampling rules (specdec.core.verify) each drafter runs under; with several, methods are named "SPEC [RULE]"
    acceptance: list[Acceptance] = field(default_factory=lambda: [Acceptance.MATCH])
    kv_dtype: str = "auto"  # ours: the target's KV cache elements

    def __post_init__(self):
        self.k = KSetting.parse(self.k)  # an integer, 'auto' or 'auto:N' given as such is read here
        self.acceptance = [Acceptance.parse(rule) for rule in self.acceptance]
        self.drafters = [DrafterChoice.parse(spec) for spec in self.drafters]


@dataclass
class PromptRun:
    task: str
    prompt_id: str
    method: str
    new_tokens: int
    seconds: float
    tokens_per_second: float
    tau: float | None = None  # speculative methods only
    acceptance_rate: float | None = None
    acceptance_per_position: list[float] | None = None
    draft_seconds: float | None = None
    verify_seconds: float | None = None
    k_chosen: dict[int, int] | None = None
    matches_plain: bool | None = None  # greedy, or ours under the match rule: token for token equal to plain
    rounds: int | None = None  # target forwards after prefill (ours only; plain: one per token)
    drafted: int | None = None
    accepted: int | None = None
    decode_seconds: float | None = None  # seconds after prefill
    drafter_memory_bytes: int | None = None  # what the drafter holds beyond the target, at the end


@dataclass
class BenchResults:
    config: BenchConfig
    machine: dict
    runs: list[PromptRun]
    roofline: Roofline | None = None
    memory: dict | None = None  # target_weights_mb (as held, in its format), peak_rss_mb (the whole process)

    def to_dict(self) -> dict:
        config = {**asdict(self.config), "k": str(self.config.k), "drafters": [c.text for c in self.config.drafters]}
        return {"config": config, "machine": self.machine,
                "runs": [asdict(r) for r in self.runs],
                "roofline": asdict(self.roofline) if self.roofline else None, "memory": self.memory}


def memory_info(target: LoadedModel) -> dict:
    """What the target's weights occupy in their loaded format, and the process's peak resident memory."""
    import resource

    return {"target_weights_mb": target.model.nbytes / 1e6,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB


def machine_info() -> dict:
    """Where the figures came from: the CPU by name and the kernel build it runs (AVX2, AVX-512, AMX)."""
    from specdec.kernels.build import cpuinfo_field, default_kernel_name

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu": cpuinfo_field("model name") or platform.machine(), "cpu_kernels": default_kernel_name(),
            "threads": torch.get_num_threads(), "torch": torch.__version__}


class Method:
    """One way of generating: ours (plain or a drafter) or a peer (transformers, llama.cpp)."""

    def __init__(self, name: str, generator: SpeculativeGenerator | None = None, peer=None):
        self.name, self.generator, self.peer = name, generator, peer

    @property
    def reproduces_plain(self) -> bool:
        """Whether this method's tokens must equal plain decoding's under the bench's seed: ours under the
        match rule (greedy decoding is the match rule's special case)."""
        return self.generator is not None and self.generator.acceptance is Acceptance.MATCH

    def run(self, target: LoadedModel, prompt: BenchPrompt, config: BenchConfig) -> tuple[PromptRun, list[int]]:
        ids = SpeculativeGenerator(target, None).encode(prompt.prompt, chat=prompt.chat)
        if self.peer is not None:
            out = self.peer.generate(ids, config.max_new_tokens, target.eos_token_ids)
            n = out.new_tokens
            return PromptRun(prompt.task, prompt.prompt_id, self.name, n, out.seconds, n / out.seconds), out.token_ids
        request = GenerationRequest(prompt.prompt, config.max_new_tokens, config.sampling, seed=config.seed,
                                    chat=prompt.chat)
        result = self.generator.run(request)
        s = result.stats
        speculative = self.name != PLAIN
        run = PromptRun(
            prompt.task, prompt.prompt_id, self.name, s.new_tokens, s.seconds, s.tokens_per_second,
            tau=s.tau if speculative else None,
            acceptance_rate=s.acceptance_rate if speculative else None,
            acceptance_per_position=s.acceptance_per_position if speculative else None,
            draft_seconds=s.draft_seconds if speculative else None,
            verify_seconds=s.verify_seconds,
            k_chosen=s.k_chosen if speculative else None,
            rounds=s.rounds, drafted=s.drafted, accepted=s.accepted, decode_seconds=s.seconds - s.prefill_seconds,
            drafter_memory_bytes=s.drafter_memory_bytes if speculative else None,
        )
        return run, result.token_ids


def zoo_draft(target: LoadedModel) -> str | None:
    """The zoo model `--drafter auto` weighs as this target's same-tokenizer draft (llama.cpp's draft peers run
    the same one), if any."""
    return next((c.draft for c in candidates_for(target, "cpu").chosen_from
                 if c.kind == "same tokenizer" and c.draft in zoo.REGISTRY), None)


def build_methods(config: BenchConfig, target: LoadedModel) -> list[Method]:
    methods = [Method(PLAIN, SpeculativeGenerator(target, None))]
    for choice in config.drafters:
        spec, name = choice, choice.text
        if choice.default:  # what generate and serve would run for this target
            spec = auto_drafter(target, config.device, config.dtype)
            name = f"auto ({spec})"
        for rule in config.acceptance:
            drafter = make_drafter(spec, target, config.device, config.dtype)
            label = name if len(config.acceptance) == 1 else f"{name} [{rule}]"
            methods.append(Method(label, SpeculativeGenerator(target, drafter, config.k, rule)))
    for peer in config.peers:
        mode, _, model = peer.partition(":")
        if mode.startswith("llamacpp"):
            cpp_modes = parse_peer(peer, zoo_draft(target))
            if not cpp_modes:
                raise InvalidParameterError(f"unknown llama.cpp peer {peer!r} (llamacpp, llamacpp-draft:MODEL[@N], "
                                            "llamacpp-spec:TYPES[@N][:MODEL], llamacpp-best)")
            for cpp_mode in cpp_modes:
                cpp = LlamaCppPeer(config.target, cpp_mode, target.tokenizer, torch.get_num_threads())
                methods.append(Method(cpp.name, peer=cpp))
            continue
        assistant = resolve_model_dir(model)[1] if mode == "assisted" else None
        transformers_peer = TransformersPeer(target.path, mode, assistant, config.device, config.dtype)
        name = transformers_peer.name + (f":{model}" if model else "")
        methods.append(Method(name, peer=transformers_peer))
    return methods


def run_bench(config: BenchConfig, prompts: list[BenchPrompt], progress: bool = True) -> BenchResults:
    target = load_model(config.target, device=config.device, dtype=config.dtype, weights=config.weights,
                        cuda_graphs=config.cuda_graphs, backend=config.backend, kv_dtype=config.kv_dtype)
    if config.weights == "auto":  # report what it resolved to
        config = dataclasses.replace(config, weights=target.model.weight_format)
    roofline = measure_roofline(target.model, config.roofline_buffer_mb, config.device) \
        if config.roofline_buffer_mb else None
    methods = build_methods(config, target)
    warmup = BenchPrompt("warmup", "warmup", "Hello", True)
    if not target.has_chat_template:
        prompts, warmup = [p.for_base_model() for p in prompts], warmup.for_base_model()
    warm_config = dataclasses.replace(config, max_new_tokens=8)
    for method in methods:  # first calls build kernels and fill allocator pools
        method.run(target, warmup, warm_config)
    runs: list[PromptRun] = []
    for prompt in tqdm(prompts, desc="bench", unit="prompt", disable=not progress):
        plain_ids = None
        for method in methods:  # interleaved: machine noise hits every method alike
            run, ids = method.run(target, prompt, config)
            if method.name == PLAIN:
                plain_ids = ids
            elif ids is not None and (config.sampling.greedy or method.reproduces_plain):
                run.matches_plain = ids == plain_ids
            runs.append(run)
    return BenchResults(config, machine_info(), runs, roofline, memory_info(target))
