"""The one typed schema for the whole loop: extract -> train -> export -> serve -> bench.

Unknown keys are errors everywhere (``extra="forbid"``). The ``engine`` section is shared by
extraction and serving on purpose: hidden states must be captured by the same build and flags that
will serve the draft ("train as you infer").
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from eaglebox.target.layers import CONVENTIONS, Convention

CAPTURE_WRITERS = 8
"""Default threads of the capture server's writer process (``extract.capture_writers``; the sink's and the
hook's default too): docs/measurements.md, "Measurements behind the code"."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: Path
    """HF-style directory of the target (config.json, tokenizer, safetensors)."""
    tp: int = Field(1, ge=1)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "bfloat16"
    quantization: str | None = None
    """Passed to SGLang as --quantization; None lets SGLang read it from the checkpoint."""
    dp: int = Field(1, ge=1)
    """SGLang's --dp-size."""
    ep: int = Field(1, ge=1)
    """SGLang's --ep-size (expert parallelism)."""
    trust_remote_code: bool = False
    """Run code shipped with the model (Kimi-K2.5's tokenizer): the tokenizer loads with it and SGLang
    gets --trust-remote-code."""


class CaptureConfig(Section):
    layer_ids: list[int] | None = None
    """Aux layers; None derives the EAGLE-3 default from the target's layer count."""
    convention: Convention = "output_of_layer"
    """How ``layer_ids`` are named: output_of_layer (SGLang) or input_of_layer (vLLM, EAGLE ref)."""

    @model_validator(mode="after")
    def _known_convention(self) -> CaptureConfig:
        if self.convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}")
        return self


KEYED_FLAGS = {
    **dict.fromkeys(("--model-path", "--model"), "model.path"),
    **dict.fromkeys(("--tp", "--tp-size", "--tensor-parallel-size"), "model.tp"),
    **dict.fromkeys(("--dp", "--dp-size", "--data-parallel-size"), "model.dp"),
    **dict.fromkeys(("--ep", "--ep-size", "--expert-parallel-size"), "model.ep"),
    "--dtype": "model.dtype", "--quantization": "model.quantization", "--trust-remote-code": "model.trust_remote_code",
    "--device": "engine.device", "--attention-backend": "engine.attention_backend",
    "--moe-runner-backend": "engine.moe_runner_backend", "--kv-cache-dtype": "engine.kv_cache_dtype",
}
"""SGLang flags that ``engine.extra_args`` may not carry: eaglebox sets them from these keys."""


class EngineConfig(Section):
    """SGLang launch settings shared by extraction and serving."""

    device: Literal["cuda", "cpu"] = "cuda"
    host: str = "127.0.0.1"
    port: int = Field(30000, ge=1, le=65535)
    attention_backend: str | None = None
    """None lets SGLang choose; SM120 presets name one explicitly."""
    moe_runner_backend: str | None = None
    kv_cache_dtype: str | None = None
    """SGLang's --kv-cache-dtype; None: the model dtype."""
    mem_fraction_static: float | None = Field(None, gt=0, le=1)
    max_total_tokens: int | None = Field(None, ge=1)
    chunked_prefill_size: int | None = None
    extra_args: list[str] = []
    """More SGLang flags, after eaglebox's own. Read by SGLang's parser: each option they change is
    recorded in the capture spec (``engine_options.extra_args``), compared at serving like the keyed ones."""
    env: dict[str, str] = {}
    startup_timeout_s: float = Field(900, gt=0)

    @field_validator("extra_args")
    @classmethod
    def _no_keyed_flags(cls, args: list[str]) -> list[str]:
        for arg in args:
            flag = arg.split("=", 1)[0]
            if flag in KEYED_FLAGS:
                raise ValueError(f"{flag} has its own key, {KEYED_FLAGS[flag]}, which the capture spec records "
                                 "(features and serving are compared by it); set that key instead")
        return args


class ExtractConfig(Section):
    dataset: Path | None = None
    format: Literal["auto", "sharegpt", "messages", "text"] = "auto"
    output_dir: Path = Path("runs/shards")
    max_length: int = Field(2048, ge=2)
    concurrency: int = Field(4, ge=1)
    shard_size: int = Field(256, ge=1)
    """Samples per shard file."""
    chat_template: Path | None = None
    """A Jinja file; None uses the tokenizer's own template."""
    on_bad_row: Literal["error", "skip"] = "error"
    max_row_bytes: int | None = Field(None, ge=1)
    """Rows over this many bytes are bad rows, refused before parsing and tokenizing; None: 64 bytes
    a token of ``max_length``."""
    max_samples: int | None = Field(None, ge=1)
    regenerate: bool = False
    """Replace assistant turns by the target's own answers (same server) before capture; greedy unless
    ``regenerate_temperature`` > 0."""
    regenerate_max_new_tokens: int = Field(512, ge=1)
    regenerate_temperature: float = Field(0.0, ge=0)
    """0: greedy (the target's most likely answer). A small model's greedy answers repeat across
    prompts and loop on one phrase; sampling gives the draft the varied text it will meet when the
    target is served with sampling. SGLang samples without a seed here, so two runs differ (the
    ``regenerated.jsonl`` cache keeps one run's answers)."""
    regenerate_top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: the smallest set of tokens holding this probability mass (1.0: all); cuts the
    unlikely tail that sampling from a small model turns into garbled words."""
    regenerate_top_k: int | None = Field(None, ge=1)
    """Sample among the k most likely tokens only; None: no limit."""
    regenerate_repetition_penalty: float = Field(1.0, gt=0, le=2)
    """SGLang 0.5.23's repetition penalty: > 1 makes tokens the answer already holds less likely (not
    the prompt's: copying from the prompt costs nothing), so a loop cannot settle; 1.0: none. Applies
    to greedy answers too."""
    max_retries: int = Field(5, ge=0)
    retry_backoff_s: float = Field(1.0, ge=0)
    writer_buffer_mb: int = Field(4096, ge=1)
    """Feature bytes (MiB) the server may hold for samples waiting for the disk before its scheduler
    waits for the writer: bounds host memory in bytes, whatever the sample lengths."""
    capture_writers: int = Field(CAPTURE_WRITERS, ge=1, le=64)
    """Threads of the server's writer process; each hashes a sample, then writes and fsyncs it. 8: on a
    16-core GPU host 4 kept capture at 0.66x of the disk's rate, 8 at 0.94-1.00x (docs/measurements.md,
    "Measurements behind the code")."""


ROPE_KEYS = {"rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings", "low_freq_factor",
             "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
             "attn_factor", "extrapolation_factor", "truncate", "partial_rotary_factor"}
"""Keys of a default, llama3 or yarn RoPE block that transformers or SGLang read."""


class DraftConfig(Section):
    """Draft shape overrides; None takes the target's value."""

    architecture: Literal["llama", "deepseek_mla"] = "llama"
    """The draft class SGLang 0.5.23 loads: ``LlamaForCausalLMEagle3`` (GQA attention) or
    ``Eagle3DeepseekV2ForCausalLM`` (DeepSeek-V2 multi-latent attention, what public Kimi drafts use:
    a KV cache of ``kv_lora_rank + qk_rope_head_dim`` values a token)."""
    fc_norm: bool = False
    """EAGLE-3.1: an RMSNorm on each captured layer's features before ``fc`` (both classes)."""
    norm_output: bool = False
    """EAGLE-3.1: the next draft step gets the final-normed hidden state, not the pre-norm one."""
    q_lora_rank: int | None = Field(None, ge=1)
    """deepseek_mla only, like the four below; None takes the (MLA) target's value."""
    kv_lora_rank: int | None = Field(None, ge=1)
    qk_nope_head_dim: int | None = Field(None, ge=1)
    qk_rope_head_dim: int | None = Field(None, ge=2, multiple_of=2)
    v_head_dim: int | None = Field(None, ge=1)
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    draft_vocab_size: int = Field(32000, ge=1)
    rope_scaling: dict | None = None
    """Replaces the RoPE block the draft copies from the target (e.g. ``{"rope_type": "default"}``), for
    a target block that the trainer and SGLang's draft class would read differently."""

    @field_validator("rope_scaling")
    @classmethod
    def _known_rope_keys(cls, rope: dict | None) -> dict | None:
        unknown = sorted(set(rope or {}) - ROPE_KEYS)
        if unknown:
            raise ValueError(f"unknown keys {unknown}: neither the trainer nor SGLang reads them "
                             f"(known: {sorted(ROPE_KEYS)})")
        return rope


class MooncakeConfig(Section):
    """The Mooncake store (``train.online.transport: mooncake``; package ``mooncake-transfer-engine-non-cuda``,
    the system package ``libibverbs1``): the capture server's writer process puts each sample there under a
    key, the trainer gets it by key, verifies it and removes the key, over Mooncake's TCP transfer engine.
    For hosts that share no file system; ``mooncake_master`` runs somewhere both reach."""

    master: str = "127.0.0.1:50051"
    """``host:port`` of the ``mooncake_master`` RPC service (its ``--rpc_port``)."""
    metadata_server: str = "P2PHANDSHAKE"
    """Where Mooncake's transfer engines find each other: ``P2PHANDSHAKE`` (no metadata service: each
    process answers for itself) or an HTTP metadata server's URL (``http://host:port/metadata``, e.g. the
    master's own with ``--enable_http_metadata_server``)."""
    local_hostname: str | None = None
    """The address other hosts reach this process at; None: this host's address on the route to ``master``.
    The capture server and the trainer each take it from their own config (set it where that route's
    address is not the one to advertise)."""
    segment_bytes: int = Field(256 << 20, ge=16 << 20)
    """Memory the capture server's writer process lends the store (the samples live there until the trainer
    has read them), and each side's transfer buffer. Must hold the samples in flight at ``extract.max_length``
    below the master's eviction watermark (90%): checked before the server starts. Mooncake's minimum: 16 MiB."""
    connect_timeout_s: float = Field(20, gt=0)
    """How long to wait for the master to answer before refusing to start."""
    key_prefix: str = "eaglebox"
    """Keys are ``<key_prefix>/<sample id>`` (``<key_prefix>/rank<R>/<sample id>`` under ``torchrun``); trainers
    that share one master need prefixes of their own (a run removes what is under its prefix at start)."""

    @field_validator("master")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{v!r} is not host:port (the mooncake_master's address and --rpc_port)")
        return v

    @field_validator("metadata_server")
    @classmethod
    def _metadata(cls, v: str) -> str:
        if v != "P2PHANDSHAKE" and not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r}: P2PHANDSHAKE or an HTTP metadata server's URL (http://host:port/metadata)")
        return v

    @field_validator("key_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not v or not all(c.isalnum() or c in "-_." for c in v):
            raise ValueError(f"{v!r}: letters, digits, '-', '_' or '.' (at least one)")
        return v


class OnlineConfig(Section):
    """Training without storing every feature (``train.data: online | hybrid``, issue 31): a capture
    server launched as ``eaglebox extract`` launches it writes each sample the next batches need into
    ``spool_dir``; the trainer verifies it as extraction does, reads it and deletes it (hybrid keeps it
    while the spool stays under ``budget_bytes``)."""

    spool_dir: Path | None = None
    """The capture server's capture directory (in-flight samples) and, under ``kept/``, hybrid's cache;
    None: ``train.output_dir/spool``. One trainer per spool; under ``torchrun`` each rank has its own
    ``rank<R>/`` folder in it (the files of ranks that share a sample across an epoch's end never collide)."""
    budget_bytes: int | None = Field(None, ge=1)
    """Disk the spool may hold at its high-water mark: the samples in flight (``extract.concurrency``, at
    most ``train.loader_threads`` x ``train.batch_size``, + 1, of the longest) plus what hybrid keeps.
    Required for hybrid; with online, a budget the samples in flight could pass is refused before the
    server starts. Under ``torchrun`` it is for the whole spool: each of N ranks has ``budget_bytes / N``
    for its own samples in flight and kept ones (so no rank waits on another's accounting)."""
    url: str | None = None
    """A capture server already running with ``spool_dir`` as its capture directory (started as
    ``eaglebox extract`` starts one, for this config's capture spec: one launched for another is refused at
    the first sample, before the run writes anything); None: the trainer starts its own."""
    transport: Literal["file", "mooncake"] = "file"
    """How samples reach the trainer: ``file``, the capture server's files in ``spool_dir`` (one host or a
    shared file system); ``mooncake``, the Mooncake store (``mooncake`` below), across hosts: the trainer
    writes each sample it gets to its own ``spool_dir`` to verify and read it (and, hybrid, keep it)."""
    mooncake: MooncakeConfig = MooncakeConfig()
    restarts: int = Field(3, ge=0)
    """Times the trainer restarts its own capture server after it exits (kill -9, out of memory) before it
    stops naming the cause; a server at ``url`` is waited for (``extract.max_retries``) instead."""


class TrainConfig(Section):
    output_dir: Path = Path("runs/train")
    data: Literal["offline", "online", "hybrid"] = "offline"
    """Where features come from: ``offline`` reads the shards in ``extract.output_dir``; ``online``
    captures each sample when the loader needs it (``train.online``) and keeps nothing; ``hybrid`` keeps
    captured samples up to ``train.online.budget_bytes`` and captures the rest again each epoch. The
    samples are ``extract``'s (data set, tokenization, ``max_length``, regeneration) in both."""
    online: OnlineConfig = OnlineConfig()
    draft: DraftConfig = DraftConfig()
    lr: float = Field(1e-4, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(0.5, gt=0)
    epochs: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)
    batch_size: int = Field(1, ge=1)
    """Samples per rank per step (the global batch is batch_size x ranks)."""
    max_length: int = Field(2048, ge=2)
    loader_threads: int = Field(4, ge=1)
    """Threads that read, verify (sha256) and pad batches ahead of the step, one batch each (held in host
    memory until its step); hashing releases the GIL, so verification keeps pace with the step as long
    as these threads keep pace with the disk."""
    ttt_length: int = Field(7, ge=1)
    loss_decay: float = Field(0.8, gt=0, le=1)
    loss: Literal["soft_ce", "lk_alpha"] = "soft_ce"
    """The draft's objective against the target's distribution p: soft cross entropy (the standard
    EAGLE-3 proxy), or LK^alpha, -log sum_v min(p_v, q_v), the acceptance probability itself (arXiv
    2602.23881), which a small draft's soft CE optimum need not maximise (docs/training.md#loss)."""
    seed: int = 0
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    checkpoint_every: int = Field(200, ge=1)
    """Steps between checkpoints; the run always checkpoints at its last step."""
    keep_checkpoints: int = Field(2, ge=1)
    log_every: int = Field(10, ge=1)
    cuda_graphs: bool = True
    """On one CUDA process, replay each step as a CUDA graph (one per batch shape); with several
    ranks, or on CPU, steps run eagerly. The run logs which."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """With several torchrun ranks: ddp replicates the draft; fsdp (FSDP2) shards weights, gradients
    and optimizer state, for drafts too wide to replicate."""
    heldout_share: float = Field(0.0, ge=0, lt=1)
    """Share of the shards' samples never trained on (a seeded choice): the held-out requests on which
    the trainer measures simulated acceptance with the gate's evaluator (``eaglebox.train.heldout``).
    0 turns held-out evaluation off (the last weights are exported)."""
    eval_every: int | None = Field(None, ge=1)
    """Steps between held-out evaluations (also at step 0, as an untrained control, and at the last
    step); None: at the last step only."""
    eval_max_samples: int = Field(32, ge=1)
    """Held-out requests scored per evaluation (the first of the held-out samples)."""
    export: Literal["best", "last"] = "best"
    """Which weights become ``output_dir/draft`` when held-out evaluation is on: the best held-out
    acceptance length (``draft-last`` keeps the last beside it), or the last."""

    @model_validator(mode="after")
    def _hybrid_has_a_budget(self) -> TrainConfig:
        if self.data == "hybrid" and self.online.budget_bytes is None:
            raise ValueError("train.data: hybrid keeps samples on disk up to train.online.budget_bytes; set it")
        return self


ENGINE_OPTIONS = ("quantization", "dtype", "attention_backend", "moe_runner_backend", "kv_cache_dtype", "tp", "dp", "ep")
"""The capture spec's engine options that ``serve.allow_engine_differences`` may name whole."""

NEUTRAL_EXTRA_ARGS = {
    "triton_attention_num_kv_splits":
        "SGLang 0.5.23's Triton backend splits the KV only in its decode kernel; the extend and target-verify "
        "passes, whose hidden states the capture and the draft read, run with num_kv_splits=None",
    "sampling_backend":
        "picks the next token from the logits after the forward; it computes no hidden state",
}
"""The SGLang options (by name) that ``serve.allow_engine_differences`` may name as ``extra_args.<name>``,
and why each cannot change the hidden states a draft reads. Any other flag (a prefill backend, a CUDA
graph's batch sizes, which pick other kernels for padded shapes) may, and is compared."""


class ServeConfig(Section):
    draft_path: Path | None = None
    """Exported draft directory; None serves the target alone."""
    num_steps: int = Field(3, ge=1)
    eagle_topk: int = Field(1, ge=1)
    num_draft_tokens: int = Field(4, ge=2)
    draft_attention_backend: str | None = None
    draft_quantization: str = "unquant"
    allow_provenance_mismatch: bool = False
    allow_engine_differences: list[str] = []
    """Engine options (as the capture spec records them: :data:`ENGINE_OPTIONS`, or
    ``extra_args.<SGLang option>`` of :data:`NEUTRAL_EXTRA_ARGS`) that may differ between the capture the
    draft was trained on and this serving launch; any other difference is refused."""

    @field_validator("allow_engine_differences")
    @classmethod
    def _known_options(cls, names: list[str]) -> list[str]:
        """``extra_args`` whole would accept any flag, a feature-changing one too: flags are named one by one."""
        neutral = ", ".join(f"extra_args.{k}" for k in NEUTRAL_EXTRA_ARGS)
        for name in names:
            if name not in ENGINE_OPTIONS and name.removeprefix("extra_args.") not in NEUTRAL_EXTRA_ARGS:
                raise ValueError(f"{name!r} cannot be allowed to differ: name engine options ({', '.join(ENGINE_OPTIONS)}) "
                                 f"or extra_args flags that cannot change hidden states ({neutral})")
        return names


class Chain(Section):
    """One draft-tree setting SGLang serves with (``--speculative-num-steps / -eagle-topk /
    -num-draft-tokens``)."""
    num_steps: int = Field(ge=1)
    eagle_topk: int = Field(ge=1)
    num_draft_tokens: int = Field(ge=2)

    def label(self) -> str:
        return f"{self.num_steps}/{self.eagle_topk}/{self.num_draft_tokens}"


class BenchConfig(Section):
    prompts: Path | None = None
    """Held-out prompts (same dataset formats as extract); None takes extract's dataset tail."""
    num_prompts: int = Field(32, ge=1)
    max_new_tokens: int = Field(128, ge=1)
    concurrency: list[int] = [1, 8]
    min_accept_length: float | None = None
    output_dir: Path = Path("runs/bench")
    url: str | None = None
    """A running target + draft server to measure (the compose ``target`` service). None starts the
    target alone and the speculative servers beside it and measures them in alternating rounds."""
    rounds: int = Field(3, ge=1)
    """Rounds of target / speculative measurements; the report gives each ratio's median and worst."""
    chains: list[Chain] = []
    """Chain settings to sweep (the best per concurrency is reported); empty: the serve section's."""
    control: bool = True
    """Also serve the random-weights control draft (same shape and vocabulary) at the first chain."""
    servers_at_once: int = Field(3, ge=2)
    """Servers alive at once, the target's included (each holds the target's weights)."""
    min_requests: int | None = Field(None, ge=1)
    """At concurrency c, send max(c, this) of the prompts; None sends all ``num_prompts`` at every level."""
    target_url: str | None = None
    """The target alone, already running (started as ``eaglebox bench`` starts it: this config's model and
    engine flags, no draft): the rounds compare against it instead of a target server of their own, so
    drafts benched one after another share one. None starts the target."""

    @model_validator(mode="after")
    def _one_running_server(self) -> BenchConfig:
        if self.url and self.target_url:
            raise ValueError("bench.url measures a running target + draft server alone; bench.target_url is "
                             "the target the side-by-side rounds compare against: set one")
        return self


class Config(Section):
    model: ModelConfig
    capture: CaptureConfig = CaptureConfig()
    engine: EngineConfig = EngineConfig()
    extract: ExtractConfig = ExtractConfig()
    train: TrainConfig = TrainConfig()
    serve: ServeConfig = ServeConfig()
    bench: BenchConfig = BenchConfig()
