"""King versus challenger: a head is promoted only when it is really better.

Every promotable kind goes through the one contest (`contest.py`: gates, scoring with the king on
the same held-out rows, the composite with its overfit gate, this module's `decide`, the pointer
swapped by compare-and-swap, every attempt in the kind's history). This module holds the policy
(`PromotionPolicy`, `configs/promotion.yaml`) and the decision (`decide`); the router slot's entry
point, `promote_best` (the `promoted_router` asset and `fugu-lite validate`: one-step heads and
answer-aware cascades, each scored on the same held-out rows), is the policies registry's
(`policies/registry.py`), which composes the kinds that share the slot.

Before a challenger is scored it passes the submission gates (`gates.py`): the rate limit (one
attempt per period per submitter, or per signing key for a pack), weight sanity (shape, finite,
not all zero; a checkpoint too broken to load fails here), a signed pack's signature, the
contract, duplicate detection by behaviour (cosine ≥ 0.99 of centred scores on the host's probe
set, to a head judged before or the king) and the training receipt with the cost ledger behind it.

Then it replaces the promoted head only if, on the same frozen held-out eval rows (the test split
minus its audit slice, `composite.py`), it
1. beats the best fixed alternative (a one-step head: the best fixed worker chosen on train):
   mean paired gain above zero, and the paired bootstrap 95% interval's low end above zero,
2. beats the promoted head (the king) by TinyRouter's rule on the composite:
   composite(challenger) ≥ composite(king) + 0.02, with the paired bootstrap low end of the
   difference above zero as well, and is not rejected by the composite's overfit gate,
3. reads features the serving encoder model computes: its own feature contract, scored on the
   same rows encoded as that contract says (layers, prompt rules, lexical block and the like may
   differ from the pipeline's, as serving computes each checkpoint's own; another encoder model
   may not, `feature_source.py`),
4. its train-minus-held-out gap is under a threshold, and
5. for a quality head: its predicted qualities are not all in one narrow band (std under
   `min_quality_std`), which means it learnt nothing about which worker is good where.
The pointer (`models/promoted/current.json` for the one-step router) is replaced atomically
(temp file, fsync, rename, fsync of the folder) under a lock held for the whole attempt
(`models/promoted/.lock`: a second attempt waits and faces the new king), then every decision is
appended to `models/promoted/history.jsonl` with its submitter (the pointer first: the history
never claims a promotion whose pointer was not written); a head that was scored joins the
registry of judged heads (`models/promoted/seen/`). A challenger outside the models folder (a
pack) is copied into `models/<method>/<hash>/` when promoted.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.config_files import Seed
from fugu_pipeline.evaluate.composite import CompositeConfig
from fugu_pipeline.evaluate.decision import Candidate, Decision, decide, weight_gate  # noqa: F401 (this module's API too)
from fugu_pipeline.evaluate.gates import GateConfig
from fugu_pipeline.evaluate.promotion_record import (  # noqa: F401 - append_history, apply: this module's API too
    append_history,
    apply,
    check_writable,
    promotion_lock,
)


class ProjectRuns(BaseModel):
    """The rule of the project's own pipeline runs (the schedule, the sensors, backfills, `fugu-lite
    pipeline`, runs launched from the UI), told apart by how Dagster launched them (`defs/harness.py
    project_run`); `gates` is the rule of everyone else (`fugu-lite validate`, `evaluate-roles
    --promote`). The project's runs make one attempt per new batch or catalog change, not a search
    over the held-out rows, so by default they are not rate limited."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rate_limit_s: float = Field(0.0, ge=0, description="at most one promotion attempt of the project's own runs per this "
                                                        "many seconds (0: off)")


class PromotionPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    margin: float = Field(0.02, ge=0.0, description="replace the king only at challenger ≥ king + margin (paired mean held-out utility)")
    min_gain_over_best_fixed: float = Field(0.0, description="required paired mean gain over the best fixed worker (strictly above)")
    require_significant: bool = Field(True, description="also require the paired bootstrap 95% interval's low end above zero, "
                                                        "against the best fixed worker and against the king")
    max_train_gap: float = Field(0.25, gt=0.0, description="largest allowed train minus held-out router utility")
    min_quality_std: float = Field(0.01, ge=0.0, description="a quality head whose held-out predictions have a smaller std is refused")
    n_boot: int = Field(2000, ge=100)
    seed: Seed = 0
    composite: CompositeConfig = Field(default_factory=CompositeConfig, description="the composite score the king is judged on")
    gates: GateConfig = Field(default_factory=GateConfig, description="rate limit, duplicate, receipt")
    project_runs: ProjectRuns = Field(default_factory=ProjectRuns, description="the project's own pipeline runs' rule")

    def for_project_run(self) -> "PromotionPolicy":
        """The policy of one of the project's own runs: its rate limit is `project_runs.rate_limit_s`."""
        return self.model_copy(update={"gates": self.gates.model_copy(update={"rate_limit_s": self.project_runs.rate_limit_s})})


class PolicyError(ValueError):
    """The promotion policy file is broken; the message names the file and the field."""


DEFAULT_POLICY_FILE = "configs/promotion.yaml"


def project_policy(project_dir: str | Path, policy_file: str | Path | None = None, *, project_run: bool = False,
                   **overrides) -> PromotionPolicy:
    """The promotion policy every command and asset reads: `policy_file` (`--policy`, the asset's
    `policy_file`; relative to the project folder), else the project's `configs/promotion.yaml`,
    through `load_policy`. A file other than the default one must exist; a missing default file
    means the defaults. `project_run`: one of the project's own pipeline runs (`ProjectRuns`)."""
    name = Path(policy_file or DEFAULT_POLICY_FILE)
    path = name if name.is_absolute() else Path(project_dir) / name
    required = policy_file is not None and name != Path(DEFAULT_POLICY_FILE)
    return load_policy(path, required=required, project_run=project_run, **overrides)


def load_policy(path: str | Path | None, *, required: bool = False, project_run: bool = False,
                **overrides) -> PromotionPolicy:
    """The policy from a YAML file (`configs/promotion.yaml`); a missing default file means the
    defaults, a missing file asked for by name (`required`) is an error. `project_run`: the rule of
    the project's own runs replaces the rate limit (`PromotionPolicy.for_project_run`). Then
    `overrides` that are not None replace top-level fields (`rate_limit_s` and `live_sample` reach
    into their blocks)."""
    from pydantic import ValidationError

    from fugu_pipeline.config_files import format_validation_error, load_yaml_model

    if path is not None and (required or Path(path).exists()):
        policy = load_yaml_model(path, PromotionPolicy, PolicyError, what="promotion policy file", empty_ok=True)
    else:
        policy = PromotionPolicy()
    if project_run:
        policy = policy.for_project_run()
    over = {k: v for k, v in overrides.items() if v is not None}
    if "rate_limit_s" in over:
        policy = policy.model_copy(update={"gates": policy.gates.model_copy(update={"rate_limit_s": over.pop("rate_limit_s")})})
    if "live_sample" in over:
        policy = policy.model_copy(update={"composite": policy.composite.model_copy(update={"live_sample": over.pop("live_sample")})})
    try:
        return PromotionPolicy.model_validate({**policy.model_dump(), **over})
    except ValidationError as exc:  # an override (a flag, a run config) out of range: one line naming it
        raise PolicyError(f"promotion policy: {format_validation_error(exc)}") from None

