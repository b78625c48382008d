"""vLLM's real scheduler on the CPU, built from a kvspec configuration.

:func:`build_scheduler` constructs the installed release's own ``Scheduler``
(or ``AsyncScheduler``) with a minimal ``VllmConfig``: scheduler and cache
settings, a CPU device, and no model. A scheduler reads a handful of facts
about the model (its length limit, that it is a text-only decoder, ...);
:class:`TextModel` answers exactly those and refuses any other question, so
a release that starts asking something new fails loudly, naming it, instead
of running on a guess. No weights, tokenizer or Hugging Face configuration
is involved.

The KV-cache groups are built from the kvspec kinds the way kvref's vLLM
adapter builds them (:func:`kvref.adapters.vllm.construct.make_attention_spec`).
The scheduler constructs its own ``KVCacheManager``; the keywords it passes
are captured on the way and translated back with
:func:`kvref.vllm_config.config_from_vllm`, so the configuration written into
a trace is the one the scheduler's manager was really built with (under
asynchronous scheduling vLLM 0.33.0 passes twice the step budget as
``max_in_flight_tokens``, for instance), not the one asked for.

Requires vLLM; nothing here runs without it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any, Final

from kvref.adapters.vllm import VllmApi, loaded_api
from kvref.adapters.vllm.adapter import pin_secondary_key_order
from kvref.adapters.vllm.construct import make_attention_spec
from kvref.vllm_config import config_from_vllm
from kvspec.config import KVCacheConfig, Mamba
from kvspec.errors import ConfigError

MAX_NUM_SEQS: Final = 8
"""Default cap on running requests."""


class RigError(RuntimeError):
    """The scheduler could not be built as asked, or was built otherwise."""


class Inexpressible(RigError):
    """The scheduler built a manager kvspec has no configuration for."""


@dataclass(frozen=True, slots=True)
class RigSettings:
    """What the scheduler is built with besides the KV-cache groups.

    Attributes:
        asynchronous: ``AsyncScheduler`` (the step after the next is scheduled
            before the last one's output is in) instead of ``Scheduler``.
        max_num_seqs: Most requests running at once.
        token_budget: ``max_num_batched_tokens``, the tokens of one step.
        log_stats: The scheduler keeps statistics (prefix-cache statistics,
            usage, every step).
        events: KV-cache events are on (``take_events`` every step).
        spec_tokens: Draft tokens per step (0: no speculative decoding).
        drafter: ``"eagle"`` (a drafter with KV of its own: look-ahead
            slots, and the manager drops the last hit block) or ``"ngram"``
            (drafts from the prompt: neither).
    """

    asynchronous: bool = False
    max_num_seqs: int = MAX_NUM_SEQS
    token_budget: int = 32
    log_stats: bool = False
    events: bool = False
    spec_tokens: int = 0
    drafter: str = "ngram"


@dataclass(frozen=True, slots=True)
class Rig:
    """A built scheduler and what a recorder needs of it.

    Attributes:
        scheduler: vLLM's ``Scheduler`` or ``AsyncScheduler``.
        manager: The real ``KVCacheManager`` the scheduler built.
        config: The kvspec configuration of that manager.
        api: The adapter era of the installed release.
        hasher: vLLM's request block hasher (``Request(block_hasher=...)``).
        vllm: The vLLM modules a driver uses (``request``, ``sampling``, ``outputs``).
    """

    scheduler: Any
    manager: Any
    config: KVCacheConfig
    api: VllmApi
    hasher: Any
    vllm: dict[str, Any]


class TextModel:
    """What a scheduler asks of the model config, for a text-only decoder.

    NOTE: ``VllmConfig`` accepts no model (``model_config=None``); the
    scheduler then reads a few attributes of ``vllm_config.model_config``,
    and a real ``ModelConfig`` would load a Hugging Face configuration and
    inspect the model class. This stand-in carries those attributes (the
    same for every release driven here); any other attribute raises
    ``AttributeError`` naming it.
    """

    def __init__(self, max_model_len: int, hybrid: bool) -> None:
        """A decoder of ``max_model_len`` tokens (``hybrid``: it has Mamba layers)."""
        self._facts: dict[str, Any] = {
            "max_model_len": max_model_len,
            "runner_type": "generate",
            "skip_tokenizer_init": True,
            "is_encoder_decoder": False,
            "is_multimodal_model": False,
            "multimodal_config": None,
            "is_diffusion": False,
            "uses_mrope": False,
            "uses_xdrope": False,
            "supports_multimodal_inputs": False,
            "return_sampling_mask": False,
            "is_moe": False,
            "is_hybrid": hybrid,
            "is_attention_free": False,
            "architectures": [],
            "enable_return_routed_experts": False,
            "disable_cascade_attn": True,
        }

    def __getattr__(self, name: str) -> Any:
        facts = self.__dict__.get("_facts", {})
        if name in facts:
            return facts[name]
        raise AttributeError(f"the recorder's model stand-in has no {name!r} (a release reads a new model fact)")


class Drafter:
    """What a scheduler (and ``VllmConfig``'s derived counts) ask of the
    speculative-decoding config, for an EAGLE or an n-gram drafter.

    NOTE: a real ``SpeculativeConfig`` loads the draft model's configuration;
    like :class:`TextModel`, this stand-in answers the questions the releases
    driven here ask and refuses any other, naming it.
    """

    def __init__(self, method: str, num_tokens: int) -> None:
        """``num_tokens`` drafts per step by ``method`` (``eagle`` or ``ngram``)."""
        if method not in ("eagle", "ngram"):
            raise RigError(f"unknown drafter {method!r} (eagle or ngram)")
        eagle = method == "eagle"
        self._facts: dict[str, Any] = {
            "method": method,
            "num_speculative_tokens": num_tokens,
            "num_speculative_tokens_per_batch_size": None,
            "disable_eagle_block_drop": False,
            "disable_lookahead_block_hashes": False,
            "parallel_drafting": False,
            "max_num_new_slots_for_drafting": 0,
            # 0.34.0 reads the drafter's look-ahead from its speculator config: EAGLE reserves a slot
            # per draft token and reads one token past a chunk; an n-gram drafter neither.
            "uses_target_hidden_states": eagle,  # a property from 0.34.0 on
            "speculator_config": SimpleNamespace(
                num_lookahead_tokens=num_tokens if eagle else 0, num_prefill_lookahead_tokens=1 if eagle else 0
            ),
        }
        self._answers: dict[str, bool] = {
            "use_eagle": eagle,
            "use_eagle_block_drop": eagle,
            "needs_eagle_block_drop": eagle,
            "uses_draft_model": False,
            "use_dflash": False,
            "use_dspark": False,
            "use_multi_module_mtp": False,
        }

    def __getattr__(self, name: str) -> Any:
        facts = self.__dict__.get("_facts", {})
        answers = self.__dict__.get("_answers", {})
        if name in facts:
            return facts[name]
        if name in answers:
            answer = answers[name]
            return lambda: answer
        raise AttributeError(f"the recorder's drafter stand-in has no {name!r} (a release reads a new fact)")


def build_scheduler(intended: KVCacheConfig, settings: RigSettings) -> Rig:
    """The installed vLLM's scheduler for ``intended``'s groups and pool.

    Args:
        intended: The groups, pool size, ``max_model_len``, caching switch,
            hash function and seed, EAGLE flags; ``max_num_batched_tokens``
            is ignored (the scheduler passes its own, from ``settings``).
        settings: Scheduler settings.

    Raises:
        RigError: The release cannot run ``intended`` (a refused kind, a
            mixed Mamba mode) or built a manager whose configuration differs
            from ``intended`` in its groups, pool or caching.
    """
    api = loaded_api()
    mods = _import_vllm()
    _set_globals(api, intended)
    hash_fn = api.hash_fn(intended.hash_function)
    hbs = intended.resolved_hash_block_size()
    groups = [
        api.group_spec(f"layer.{i}", make_attention_spec(api, kind), i in intended.eagle_groups)
        for i, kind in enumerate(intended.groups)
    ]
    kv_cache_config = api.kv_cache_config(intended.num_blocks, groups)
    vllm_config = _vllm_config(mods, intended, settings)
    cls = mods["async"].AsyncScheduler if settings.asynchronous else mods["sched"].Scheduler
    with _capturing_manager(mods["sched"]) as captured:
        scheduler = cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=mods["so"].StructuredOutputManager(vllm_config),
            block_size=intended.scheduler_block_size,
            hash_block_size=hbs,
            log_stats=settings.log_stats,
        )
    manager = scheduler.kv_cache_manager
    config = _recorded_config(api, intended, captured)
    pin_secondary_key_order(api.block_pool(manager))
    hasher = api.request_block_hasher(hbs, hash_fn, config.num_hash_lookahead_tokens)
    return Rig(scheduler, manager, config, api, hasher, mods)


def _import_vllm() -> dict[str, Any]:
    names = {
        "config": "vllm.config",
        "sched": "vllm.v1.core.sched.scheduler",
        "async": "vllm.v1.core.sched.async_scheduler",
        "so": "vllm.v1.structured_output",
        "outputs": "vllm.v1.outputs",
        "request": "vllm.v1.request",
        "sampling": "vllm.sampling_params",
    }
    return {key: importlib.import_module(path) for key, path in names.items()}


def _set_globals(api: VllmApi, config: KVCacheConfig) -> None:
    """The process globals vLLM hashes with, as kvref's vLLM adapter sets them."""
    env = api.env
    if env.retention_interval is not None:
        os.environ.pop(env.retention_interval, None)
    os.environ[env.int_block_hashes] = "1" if config.int_block_hashes else "0"
    os.environ[env.hash_seed] = config.hash_seed
    api.init_none_hash(api.hash_fn(config.hash_function))


def _mamba_mode(config: KVCacheConfig) -> str | None:
    modes = {k.mode for k in config.groups if isinstance(k, Mamba)}
    if len(modes) > 1:
        raise RigError(f"the Mamba groups mix modes {sorted(modes)}; vLLM has one mamba_cache_mode per model")
    return modes.pop() if modes else None


def _vllm_config(mods: dict[str, Any], intended: KVCacheConfig, settings: RigSettings) -> Any:
    cfg = mods["config"]
    mode = _mamba_mode(intended)
    cache_kwargs: dict[str, Any] = {"block_size": intended.scheduler_block_size}
    cache_kwargs["enable_prefix_caching"] = intended.enable_caching
    if mode is not None:
        cache_kwargs["mamba_cache_mode"] = mode
    cache = cfg.CacheConfig(**cache_kwargs)
    scheduler = cfg.SchedulerConfig(
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.token_budget,
        max_model_len=intended.max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        async_scheduling=settings.asynchronous,
        watermark=intended.watermark,
    )
    extra: dict[str, Any] = {}
    if settings.events:
        extra["kv_events_config"] = cfg.KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    vllm_config = cfg.VllmConfig(
        cache_config=cache, scheduler_config=scheduler, device_config=cfg.DeviceConfig(device="cpu"), **extra
    )
    vllm_config.model_config = TextModel(intended.max_model_len, mode is not None)
    if settings.spec_tokens:
        vllm_config.speculative_config = Drafter(settings.drafter, settings.spec_tokens)
        resolve = getattr(vllm_config, "_resolve_num_hash_lookahead_tokens", None)
        if resolve is not None:  # 0.34.0 settles the look-ahead hashes when the config is checked
            vllm_config.num_hash_lookahead_tokens = resolve()
    # VllmConfig settles these from the model it was not given; the scheduler reads them.
    cache.num_gpu_blocks = intended.num_blocks
    cache.enable_prefix_caching = intended.enable_caching
    if mode is not None:
        cache.mamba_cache_mode = mode
    scheduler.async_scheduling = settings.asynchronous
    return vllm_config


@contextmanager
def _capturing_manager(sched_module: Any) -> Iterator[dict[str, Any]]:
    """Record the keywords the scheduler module passes to ``KVCacheManager``.

    NOTE: the name ``KVCacheManager`` in the scheduler's module is replaced
    by a function that notes the keywords and calls the real class with
    them, for the construction only; the manager built is vLLM's own,
    unmodified.
    """
    real = sched_module.KVCacheManager
    captured: dict[str, Any] = {}

    def construct(*args: Any, **kwargs: Any) -> Any:
        if args:
            raise RigError(f"the scheduler passed {len(args)} positional argument(s) to KVCacheManager")
        captured.update(kwargs)
        return real(**kwargs)

    sched_module.KVCacheManager = construct
    try:
        yield captured
    finally:
        sched_module.KVCacheManager = real
    if not captured:
        raise RigError("the scheduler did not construct a KVCacheManager through its module's name")


def _recorded_config(api: VllmApi, intended: KVCacheConfig, captured: dict[str, Any]) -> KVCacheConfig:
    """The kvspec configuration of the manager the scheduler built, checked against ``intended``."""
    kwargs = dict(captured)
    kv_cache_config = kwargs.pop("kv_cache_config")
    try:
        config = config_from_vllm(
            kv_cache_config,
            release=api.version,
            hash_function=intended.hash_function,
            hash_seed=intended.hash_seed,
            int_block_hashes=intended.int_block_hashes,
            **kwargs,
        )
    except ConfigError as exc:
        raise Inexpressible(f"the scheduler built a manager kvspec cannot express: {exc}") from exc
    # The scheduler chooses the budget, statistics and events itself (from the
    # settings); the hash block size is passed explicitly where kvspec derives it.
    free = {"max_num_batched_tokens", "log_stats", "enable_kv_cache_events", "hash_block_size"}
    differs = [
        f.name
        for f in fields(KVCacheConfig)
        if f.name not in free and getattr(intended, f.name) != getattr(config, f.name)
    ]
    if config.resolved_hash_block_size() != intended.resolved_hash_block_size():
        differs.append("hash_block_size")
    if differs:
        shown = ", ".join(f"{n}: asked {getattr(intended, n)!r}, built {getattr(config, n)!r}" for n in differs)
        raise RigError(f"the scheduler's manager is not the one asked for ({shown})")
    return config
