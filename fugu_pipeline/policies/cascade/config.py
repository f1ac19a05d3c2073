"""The `cascade:` block of `configs/train.yaml`: whether `fugu-lite train` also fits cascades, under
which cap, per domain or pooled, and what ships: the cheapest policy not significantly below the
strongest worker (`choose`), or the utility's choice."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fugu_pipeline.cost_cap import CostCap
from fugu_pipeline.route.default_point import DEFAULT_FLOOR
from fugu_pipeline.policies.cascade.cross_encoder import CrossEncoderConfig
from fugu_pipeline.policies.cascade.search import CascadeSearch
from fugu_pipeline.train.clusters import DEFAULT_CLUSTER_MIN_GAP
from fugu_pipeline.train.groups import DEFAULT_GROUP_FLOOR


class CascadeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: fit cascades when the matrix holds the workers' replies; on: refuse a matrix without")
    workers: list[str] | None = Field(None, description="the workers a cascade may call (default: every worker)")
    cap: CostCap | None = Field(None, description="a cost cap for every domain: {usd_per_1k: 2.5}, {share: 0.3} or "
                                "share=0.3, as --cap takes it")
    domain_caps: dict[str, CostCap] = Field(default_factory=dict, description="a cap per domain (domains not named: `cap`)")
    per_domain: bool = Field(False, description="under a cap or the utility: a plan per domain (with enough rows) "
                             "under the pooled cap, not one for all (the cost-aware default: `groups`)")
    groups: Literal["auto", "domain", "cluster", "off"] = Field(
        "auto", description="the cost-aware default (no cap), and under a pooled cap (the groups' plans then share it, "
        "chosen together: policies/cascade/groups.share_cap): a plan, or one worker, per group with "
        "search.min_domain_rows non-test rows, chosen out of fold by the same rule per group and for the whole, the "
        "smaller groups and unseen domains served the pooled plan. domain: the import's domains; cluster: prompt "
        "clusters learnt from the encoder's prompt features (served by nearest centroid); auto: domains where the "
        "import names two or more, else prompt clusters; off: one plan for every prompt")
    cluster_min_gap: float = Field(DEFAULT_CLUSTER_MIN_GAP, ge=0, le=2, description="prompt clusters are planned for when their mean "
                                   "silhouette (cosine) is this much above one Gaussian blob's with the prompts' own "
                                   "covariance, or when the workers do differently on them (train/clusters.OUTCOME_Z); "
                                   "else the prompts are one kind")
    floor: float = Field(DEFAULT_FLOOR, ge=0, le=1, description="cheapest: a cheaper policy also needs the low end of "
                         "its out-of-fold interval against the strongest no further below than this (what ships must "
                         "hold on new rows; on few rows an interval that reaches 0 reaches far below it)")
    group_floor: float = Field(DEFAULT_GROUP_FLOOR, ge=0, le=1, description="per domain, a cheaper choice also needs the low end of its "
                               "interval against the strongest no further below than this (a group's rows are few: the whole's own floor "
                               "by default)")
    search: CascadeSearch = CascadeSearch()
    n_boot: int = Field(2000, ge=200, description="bootstrap resamples of the out-of-fold gain's 95% interval")
    choose: Literal["auto", "cheapest", "utility"] = Field(
        "auto", description="what ships without a cap: cheapest: the cheapest policy whose out-of-fold accuracy is not "
        "significantly below always the strongest worker's (within `margin`); utility: the best out-of-fold utility, "
        "replacing the best worker only with a gain whose 95% interval is above zero; auto: cheapest where the utility "
        "gives cost no weight (quality-only weights), utility where it prices cost")
    margin: float = Field(0.005, ge=0.0, le=0.2, description="cheapest: the most a policy's mean out-of-fold accuracy may "
                          "be below the strongest worker's (0.005: half a point), besides its interval reaching zero")
    min_rows: int = Field(50, ge=10, description="non-test rows with replies from two or more workers needed to choose "
                          "a plan; fewer: the strongest worker ships, with one line saying so")
    encode_replies: bool = Field(True, description="the verifier reads the frozen encoder's features of each reply; "
                                 "false: the replies' statistics only (a matrix too large to encode every reply)")
    run_examples: bool = Field(True, description="the verifier also runs each code reply on the examples its prompt "
                               "gives (`>>>` lines, asserts, `f(x) == y`), in the sandbox the graders use, when training "
                               "and when serving (statistics examples_passed, examples_failed); false: code is never run")
    verifier_context: bool = Field(True, description="the verifier also reads, at each step, the replies already paid "
                                   "for (agreement, answer distribution, each worker's calibration); false: each reply alone")
    cross_encoder: Literal["auto", "on", "off"] = Field(
        "auto", description="the verifier also reads a cross-encoder fine-tuned on (prompt, reply) pairs, kept when it "
        "lowers the out-of-fold log-loss; auto: with at least cross_encoder_fit.min_pairs pairs and the encoder "
        "installed; on: always (a missing encoder is an error); off")
    cross_encoder_fit: CrossEncoderConfig = CrossEncoderConfig()
    min_answer_share: float = Field(0.5, ge=0.0, le=1.0, description="a worker needs replies on this share of the "
                                    "rows for a cascade to call it")

    def searched(self) -> CascadeSearch:
        """The plan search a fit runs: under a cap (`cap` or `domain_caps`), `search.single_thresholds`
        levels where one cheap worker comes before the last step; with none, `search.thresholds` there
        too. A capped plan is the most accurate one within the cap, and a coarse grid can leave a
        tenth of the cap unused. With no cap the rungs of the cost ladder already span the costs, and
        more levels are more plans picked on the same rows: on the mixed LLMBar + HumanEval import
        the finer grid lost the cascade its 9% saving out of fold. What a fit computes for caps (the
        table at caps, the frontier) reads `search` itself, with a cap asked or not."""
        if self.cap is not None or self.domain_caps:
            return self.search
        return self.search.model_copy(update={"single_thresholds": self.search.thresholds})

    @field_validator("enabled", "cross_encoder", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):
        """YAML reads a bare `on` / `off` as true / false: they mean the words."""
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v
