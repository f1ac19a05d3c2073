"""The worker YAML: which workers exist, how to reach them, the judge, and the utility weights.

```yaml
reward: {quality_weight: 1.0, cost_weight: 0.1, latency_weight: 0.05,
         cost_scale_usd: 0.01, latency_scale_s: 10.0}
judge: {id: judge, kind: mock}
workers:
  - {id: math-expert, kind: mock, mock: {strengths: {math: 0.9}, cost_usd: 0.002, latency_s: 2.0}}
  - {id: qwen-8b, kind: openrouter, model: qwen/qwen3-8b, max_price_in_per_mtok: 0.1, max_price_out_per_mtok: 0.5}
  - {id: local, kind: openai_compatible, base_url: "http://127.0.0.1:8000/v1", model: my-model}
```
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fugu_pipeline.config_files import load_yaml_model
from fugu_pipeline.reward import MAX_AMOUNT, UtilityConfig

WORKER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
# The ids of imported routing data: the rule above plus `/` and `:` for model names such as
# `mistralai/Mixtral-8x7B-Instruct-v0.1`. A worker's `aliases` follow it, so a router trained on
# imported data can route to a configured worker. Never a path: files are named by `id` only.
IMPORT_WORKER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/\-]{0,127}$"
# The fixed columns of the reward matrix's `reward_wide` table; the worker ids are its other columns,
# so no worker id may equal one of these, nor another id, once case is ignored.
MATRIX_FIXED_COLUMNS = ("task_id", "split", "domain")


# Fields only the server reads (which requests a worker may take): left out of `answer_fields`, so
# adding or changing them never makes stored sessions or live outcomes count as another context.
SERVING_ONLY_FIELDS = frozenset({"supports_tools", "context_window", "max_output_tokens"})


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    def answer_fields(self) -> dict:
        """The spec as JSON without the serving-only fields: what decides this worker's answers."""
        return self.model_dump(mode="json", exclude=set(SERVING_ONLY_FIELDS))

    id: str = Field(pattern=WORKER_ID_PATTERN)
    aliases: list[Annotated[str, Field(pattern=IMPORT_WORKER_ID_PATTERN)]] = Field(
        default_factory=list, description="other ids a router may route to this worker by: the worker ids of "
        "imported routing data (e.g. meta-llama/Llama-3.1-8B-Instruct), so a router trained on that data calls this worker")
    max_tokens: int = Field(1024, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    system_prompt: str | None = None
    max_concurrency: int = Field(8, ge=1, description="in-process concurrent calls to this worker")
    requests_per_minute: float | None = Field(None, ge=1 / 1440, description="at most this many calls a minute "
                                              "(at least one a day)")
    supports_tools: bool = Field(False, description="the server may send it requests with `tools` or tool "
                                 "messages (OpenAI function calling); false: such requests go to other workers")
    context_window: int | None = Field(None, ge=1, description="its context length in tokens (prompt and "
                                       "completion); unset: the catalog's context_length for an openrouter worker")
    max_output_tokens: int | None = Field(None, ge=1, description="the most completion tokens it may be asked for; "
                                          "a request's max_tokens is lowered to it (unset: the catalog's "
                                          "top_provider.max_completion_tokens, else the server's global cap)")


class MockRoles(BaseModel):
    """How a mock worker plays the multi-turn roles (Thinker, Worker, Verifier; `mock_roles.py`).
    Used only when a request names a role; one-step calls are unchanged."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    plan_boost: dict[str, float] = Field(
        default_factory=dict, description="added to this worker's Worker success probability, per domain, "
        "when a good Thinker plan is earlier in the transcript")
    plan_quality: dict[str, float] = Field(
        default_factory=dict, description="probability, per domain, that its plan as Thinker is good; "
        "a domain not listed uses its strength")
    verify_catch: dict[str, float] = Field(
        default_factory=dict, description="probability, per domain, that as Verifier it flags a wrong answer "
        "(REVISE); a domain not listed uses its strength")
    verify_false_alarm: float = Field(0.05, ge=0.0, le=1.0, description="probability it flags a right answer")
    revise_boost: dict[str, float] = Field(
        default_factory=dict, description="added to this worker's Worker success probability, per domain, when "
        "its request hands it a Verifier's objection to the latest answer (a retry after REVISE)")

    @model_validator(mode="after")
    def _range(self) -> "MockRoles":
        for name in ("plan_boost", "revise_boost"):
            for dom, p in getattr(self, name).items():
                if not -1.0 <= p <= 1.0:
                    raise ValueError(f"{name}.{dom} must lie in [-1, 1], got {p}")
        for name in ("plan_quality", "verify_catch"):
            for dom, p in getattr(self, name).items():
                if not 0.0 <= p <= 1.0:
                    raise ValueError(f"{name}.{dom} must lie in [0, 1], got {p}")
        return self


class MockBehaviour(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    strengths: dict[str, float] = Field(
        default_factory=dict, description="probability of a correct answer per task domain"
    )
    default_strength: float = Field(0.3, ge=0.0, le=1.0)
    cost_usd: float = Field(0.001, ge=0.0, le=MAX_AMOUNT, description="simulated cost per call")
    latency_s: float = Field(1.0, ge=0.0, le=MAX_AMOUNT, description="simulated latency per call (reported, not slept)")
    sleep_s: float = Field(0.0, ge=0.0, le=3600.0, description="real wall-clock delay per call (tests)")
    fail_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of calls that fail (tests)")
    roles: MockRoles = Field(default_factory=MockRoles, description="multi-turn role behaviour")
    confident_when_right: float = Field(0.9, ge=0.0, le=1.0, description="chance a right answer is stated with "
                                        "confidence (otherwise hedged): the signal a verifier can read")
    confident_when_wrong: float = Field(0.15, ge=0.0, le=1.0, description="chance a wrong answer is stated with confidence")
    shared_wrong_answer: bool = Field(False, description="every worker's wrong answer is the same one (wrong answers "
                                      "then agree, as they rarely do in real models)")

    @model_validator(mode="after")
    def _range(self) -> "MockBehaviour":
        for dom, p in self.strengths.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"strengths.{dom} must lie in [0, 1], got {p}")
        return self


class MockWorker(_Base):
    kind: Literal["mock"]
    mock: MockBehaviour = MockBehaviour()
    supports_tools: bool = Field(True, description="a mock answers a request with tools by calling one (`mock.py`)")


class OpenRouterWorker(_Base):
    kind: Literal["openrouter"]
    model: str = Field(min_length=1)
    base_url: str = "https://openrouter.ai/api/v1"
    api_key_env: str = "OPENROUTER_API_KEY"
    provider: dict | None = Field(None, description="OpenRouter provider routing preferences")
    reasoning: dict | None = None
    max_price_in_per_mtok: float | None = Field(
        None, ge=0.0, description="most this model costs per million prompt tokens: the budget guard's worst case without a catalog")
    max_price_out_per_mtok: float | None = Field(
        None, ge=0.0, description="most this model costs per million completion tokens (with max_price_in_per_mtok)")

    @model_validator(mode="after")
    def _both_prices(self) -> "OpenRouterWorker":
        if (self.max_price_in_per_mtok is None) != (self.max_price_out_per_mtok is None):
            raise ValueError("set both max_price_in_per_mtok and max_price_out_per_mtok, or neither")
        return self


class OpenAICompatibleWorker(_Base):
    kind: Literal["openai_compatible"]
    model: str = Field(min_length=1)
    base_url: str = Field(min_length=1)
    api_key_env: str | None = None
    price_in_per_mtok: float = Field(0.0, ge=0.0)
    price_out_per_mtok: float = Field(0.0, ge=0.0)


WorkerSpec = Annotated[MockWorker | OpenRouterWorker | OpenAICompatibleWorker, Field(discriminator="kind")]


class CooldownConfig(BaseModel):
    """When the server stops calling a worker that keeps failing (`workers/health.py`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    after_failures: int = Field(3, ge=1, description="consecutive transient failures (timeouts, connection "
                                "errors, 408, 429, 5xx) that start a cooldown")
    first_s: float = Field(10.0, ge=0.0, description="the first cooldown; each further failure in a row doubles it "
                           "(0: no cooldown after failures; a Retry-After is still honoured)")
    max_s: float = Field(300.0, gt=0.0, description="the longest cooldown, Retry-After included")


class WorkersConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    reward: UtilityConfig = UtilityConfig()
    judge: WorkerSpec | None = None
    workers: list[WorkerSpec] = Field(min_length=1)
    timeout_s: float = Field(120.0, gt=0, description="overall deadline per call")
    connect_timeout_s: float = Field(10.0, gt=0)
    read_timeout_s: float = Field(60.0, gt=0)
    max_attempts: int = Field(4, ge=1)
    max_reply_bytes: int = Field(16_000_000, ge=1024, description="largest reply body (streamed or not) read from "
                                 "an upstream; a larger one fails the call without a retry (16 MB: far above any answer)")
    max_usd_per_run: float | None = Field(None, gt=0, description="budget guard per partition run")
    cooldown: CooldownConfig = Field(default_factory=CooldownConfig, description="serving: a worker that keeps "
                                     "failing is skipped for a while")
    max_usd_per_session: float | None = Field(
        1.0, gt=0, description="multi-turn: the most one coordinator session (`ask --mode multi-turn`, one served "
        "multi-turn request) may spend; a request's `fugu_max_usd` can only lower it. None: no per-session cap")
    max_usd_per_serve_process: float | None = Field(
        50.0, gt=0, description="multi-turn serving: the most one `serve` process spends on multi-turn sessions in "
        "all; past it such requests get a 429 until the server restarts. None: no cap")

    @model_validator(mode="before")
    @classmethod
    def _judge_model(cls, data):
        """`reward: {judge_model: M}` (the one-step router's spelling) is the judge `{id: judge, kind:
        openrouter, model: M}`; with a `judge:` block too, it is refused (one judge)."""
        return judge_model_as_judge(data)

    @model_validator(mode="after")
    def _unique(self) -> "WorkersConfig":
        ids = [w.id for w in self.workers]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate worker id(s): {', '.join(dup)}")
        seen = {c: c for c in MATRIX_FIXED_COLUMNS}  # each id names a column of the matrix (case ignored)
        for i in ids:
            if i.lower() in seen:
                raise ValueError(f"worker id {i!r} clashes with {seen[i.lower()]!r}: the reward matrix's column names "
                                 "ignore case, and task_id, split and domain are taken; rename one of them")
            seen[i.lower()] = i
        names = ids + [a for w in self.workers for a in w.aliases if a != w.id]
        dup = sorted({i for i in names if names.count(i) > 1})
        if dup:
            raise ValueError(f"alias(es) {', '.join(dup)} name more than one worker: a routed id must call one worker")
        return self

    @property
    def worker_ids(self) -> list[str]:
        return [w.id for w in self.workers]

    def worker(self, worker_id: str) -> WorkerSpec:
        """The worker with this id, or else the one with this alias."""
        for w in self.workers:
            if w.id == worker_id:
                return w
        for w in self.workers:
            if worker_id in w.aliases:
                return w
        raise KeyError(f"worker {worker_id!r} is not in the worker config (known: {', '.join(self.worker_ids)}; "
                       "a router trained on imported data routes by its ids: list them under a worker's aliases)")

    def knows(self, worker_id: str) -> bool:
        return any(worker_id == w.id or worker_id in w.aliases for w in self.workers)

    def missing_routes(self, checkpoint: object, routed: Iterable[str]) -> str | None:
        """None when every worker a router routes to is defined here (by id or alias), else the
        problem in words: a checkpoint must not pick a worker that nothing can call."""
        missing = [w for w in routed if not self.knows(w)]
        if not missing:
            return None
        return (f"checkpoint {checkpoint} routes to worker(s) {missing} that the worker config does not define "
                f"(it has {self.worker_ids}); use the worker config it was trained with, list each routed id "
                "under the aliases of the worker that should answer it, or train a router on these workers")

    def routed_id(self, name: str, routed: Iterable[str]) -> str:
        """The id a router knows for `name`: itself when the router routes by it, else the configured
        worker's id or alias that the router routes by (a router trained on imported data knows the
        data's model names, a user names the configured worker). Unknown names come back unchanged, so
        the router's own check names them."""
        routed = set(routed)
        if name in routed or not self.knows(name):
            return name
        spec = self.worker(name)
        return next((x for x in (spec.id, *spec.aliases) if x in routed), name)


class WorkerConfigError(ValueError):
    """The worker YAML is broken; the message names the file and the field."""


WORKERS_HINT = ("give a worker YAML: configs/workers.mock.yaml is the offline mock pool; for real workers copy "
                "configs/workers.openrouter.example.yaml to configs/workers.yaml and edit it")


def load_workers_config(path: str | Path) -> WorkersConfig:
    return load_yaml_model(path, WorkersConfig, WorkerConfigError, what="worker config", hint=WORKERS_HINT)


def reward_source(config: WorkersConfig, path: str | Path) -> str:
    """Where a worker config's utility weights come from, in words (shown with every matrix and report)."""
    if "reward" in config.model_fields_set:
        return f"the reward: block of {path}"
    return f"the default weights ({path} has no reward: block)"


def judge_model_as_judge(data):
    """A config mapping whose `reward:` names `judge_model`, with that key moved to a `judge:` block."""
    reward = data.get("reward") if isinstance(data, dict) else None
    if not isinstance(reward, dict) or "judge_model" not in reward:
        return data
    reward = dict(reward)
    model = reward.pop("judge_model")
    if data.get("judge") is not None:
        raise ValueError(f"reward.judge_model {model!r} and a judge: block both name the judge; keep one: "
                         f"judge: {{id: judge, kind: openrouter, model: {model}}}")
    if not isinstance(model, str) or not model.strip():
        raise ValueError("reward.judge_model: give the judge's OpenRouter model id, or a judge: block "
                         "(judge: {id: judge, kind: openrouter, model: openai/gpt-4o-mini})")
    return {**data, "reward": reward, "judge": {"id": "judge", "kind": "openrouter", "model": model}}


class _RewardBlock(BaseModel):
    model_config = ConfigDict(extra="allow")  # a whole worker YAML is fine: only `reward:` is read

    reward: UtilityConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _judge_model(cls, data):
        return judge_model_as_judge(data)


def load_reward_block(path: str | Path) -> tuple[UtilityConfig, str]:
    """The utility weights of a YAML's `reward:` block (a worker YAML, or a file holding only that
    block), read with the same model as the worker config, and where they came from in words."""
    block = load_yaml_model(path, _RewardBlock, WorkerConfigError, what="reward config")
    if block.reward is None:
        return UtilityConfig(), f"the default weights ({path} has no reward: block)"
    return block.reward, f"the reward: block of {path}"
