"""`fugu-lite`: the command line. Thin: every command calls the same core functions as the
Dagster assets. Heavy imports (torch, transformers, dagster) happen inside the
command that needs them, so `fugu-lite --help` is instant."""

from __future__ import annotations

import argparse
import sys

from fugu_pipeline.cli import data, harness, pipeline, roles, routing, sample, training
from fugu_pipeline.cli.common import CLIError
from fugu_pipeline.settings import SettingsError, settings


class _Parser(argparse.ArgumentParser):
    """argparse with a bad flag said in one line (not the whole usage block), like every other error
    of this command; `--help` still shows the usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="fugu-lite", description="A learned LLM router (Dagster pipeline).")
    sub = ap.add_subparsers(dest="command", required=True)

    def add(name, fn, help_):
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(func=fn)
        return p

    def encoder_opts(p, features: bool = True):
        p.add_argument("--encoder", default=None, help="'tiny' (built in, offline), a local model directory, or a hub id "
                       "(default: $FUGU_ENCODER, else Qwen/Qwen3-0.6B; for a checkpoint: the one it was trained on)")
        p.add_argument("--device", default="auto", help="auto (CUDA, else MPS, else CPU), cpu, cuda, mps")
        if not features:
            return
        p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                       help="encoder dtype (auto: bf16 on GPUs and CPUs with native bf16, else fp32); part of the "
                            "embedding cache's fingerprint: serve with the dtype the cache was built in")
        g = p.add_argument_group("features (a new head: these set them; with a checkpoint they come from its "
                                 "feature contract, and a flag that contradicts it is refused)")
        g.add_argument("--template", default=None, metavar="TEMPLATE",
                       help="prompt template, may use {prompt} and {domain} (default '{prompt}'), e.g. '{domain}: {prompt}'")
        g.add_argument("--pooling", default=None, choices=["mean", "last", "position"], help="default mean")
        g.add_argument("--token-position", type=int, default=None, help="pooling=position: e.g. -2 (penultimate token)")
        g.add_argument("--layers", type=int, nargs="+", default=None, metavar="L",
                       help="hidden-state layer(s): -1 = last (default); several (e.g. --layers -1 3) are pooled "
                            "and normalised one by one and concatenated")
        g.add_argument("--max-length", type=int, default=None, help="tokens read per prompt (default 512)")
        g.add_argument("--lexical", action="store_const", const=True, default=None,
                       help="append 16 lexical statistics of the prompt (length, numbers, structure) to each vector; "
                            "the ridge and MLP heads read them, kNN reads only the embedding")

    def data_opts(p):
        p.add_argument("--data", required=True, help="reward-matrix JSONL or a reward_matrix.duckdb")
        p.add_argument("--workers", "--reward-config", dest="reward_config", default=None, metavar="YAML",
                       help="the YAML whose reward: block gives the utility weights: the worker YAML generate and "
                            "pipeline --workers read (or a file with only reward:). Needed for a JSONL whose rows "
                            "carry quality; a .duckdb matrix carries its own weights")
        p.add_argument("--cache-dir", default="data/embeddings", help="embedding cache root")
        p.add_argument("--work-dir", default="data/imports", help="where the DuckDB matrix of a JSONL is built")
        encoder_opts(p)

    def route_opts(p):
        p.add_argument("--checkpoint", default=None, help="checkpoint directory, the --output folder of a train-* (its latest "
                       "checkpoint) or a models folder (its promoted router; default: --models-dir's)")
        p.add_argument("--models-dir", default="models")
        p.add_argument("--domain", default=None)
        p.add_argument("--prompt", required=True)
        p.add_argument("--allowed", nargs="+", default=None,
                       help="only route among these workers: the router's ids, or with --workers configured ids")
        p.add_argument("--cost-weight", type=float, default=None, help="'quality' heads: λ in quality − λ·cost (refused for the "
                       "other kinds, whose route it cannot move: use a budget)")
        budget_opts(p)
        encoder_opts(p)

    def prompt_rules_opt(p, default="auto"):
        p.add_argument("--prompt-rules", default=default, choices=["auto", "on", "off"],
                       help="strip boilerplate the training prompts of a domain share (a few-shot block, a system "
                            "preamble, a format footer) before encoding: auto (default) trains with and without "
                            "and keeps the better on validation; the choice goes into the feature contract")

    def budget_opts(p, what="route under a cost cap; λ is chosen on the validation split (the budget.json "
                    "train-*/evaluate write beside the checkpoint)"):
        g = p.add_argument_group("budget", what)
        g.add_argument("--cap", default=None, metavar="usd_per_1k=D|share=F",
                       help="the cost cap: expected USD per 1,000 requests (usd_per_1k=2.5) or a share of the strongest "
                            "worker's cost (share=0.3; the strongest by training quality), optionally ,margin_z=Z: the "
                            "validation cost plus Z standard errors must be within it (default 1.645)")
        g.add_argument("--budget-usd-per-1k", type=float, default=None, metavar="USD", help="the old form of --cap usd_per_1k=USD")
        g.add_argument("--budget-share", type=float, default=None, metavar="S", help="the old form of --cap share=S")
        g.add_argument("--budget-margin-z", type=float, default=None, metavar="Z", help="the old form of --cap ...,margin_z=Z")
        g.add_argument("--no-default-budget", action="store_true",
                       help="with no cap, route by the head's plain argmax instead of the checkpoint's default operating "
                            "point (the cheapest routing not significantly below the strongest worker, chosen by train)")

    p = add("pipeline", pipeline.cmd_pipeline, "materialize the whole asset graph through Dagster (the main job)")
    p.add_argument("--project-dir", default=".", help="project root (holds data/, models/, dagster.yaml)")
    p.add_argument("--workers", default="configs/workers.mock.yaml", help="worker YAML (default: the offline mock pool)")
    p.add_argument("--encoder", default=None, help="'tiny' (offline), a local model directory, or a hub id (default: $FUGU_ENCODER, else Qwen/Qwen3-0.6B)")
    p.add_argument("--stop-after", default=None, metavar="ASSET",
                   help="stop after this asset: reward_matrix or any step after it (task_embeddings, router_sft, ..., "
                        "eval_report_triage; router_roles, eval_report_roles with --roles); any other name is refused")
    p.add_argument("--roles", action="store_true", help="also train, evaluate and promote the multi-turn coordinator "
                   "(router_roles, eval_report_roles) after the one-step chain")
    p.add_argument("--layer-sets", nargs="+", default=None, metavar="'L ...'",
                   help="router_heads: several encoder-layer settings, e.g. '-1' '-1 3', chosen on validation as "
                        "`fugu-lite train --layer-sets` does (the asset's `layer_sets` config)")
    p.add_argument("--prompt-rules", default=None, choices=["auto", "on", "off"],
                   help="router_heads: the prompt-rules mode (default: the asset's, auto)")
    p.add_argument("--replace-broken-king", action="store_true", help="when a promoted head (router, triage head, "
                   "with --roles the coordinator) cannot be loaded, let the new one replace it facing the baselines "
                   "only (the steps' asset config replace_broken_king; the history records the ask; default: the "
                   "step fails and says why)")

    p = add("materialize", pipeline.cmd_materialize, "materialize one asset (one partition) through Dagster, as the "
            "UI would; a missing asset, partition or input is one line")
    p.add_argument("asset", help="the asset, e.g. tasks, router_es, eval_report_heads")
    p.add_argument("--partition", default=None, help="a partitioned asset's partition: BATCH for tasks, BATCH|WORKER for responses")
    p.add_argument("--project-dir", default=".", help="project root (holds data/, models/, dagster.yaml)")
    p.add_argument("--workers", default="configs/workers.mock.yaml", help="worker YAML (default: the offline mock pool)")
    p.add_argument("--encoder", default=None, help="'tiny' (offline), a local model directory, or a hub id")

    p = add("doctor", pipeline.cmd_doctor, "check Python, torch/CUDA, the key (present or not), Dagster home, disk")
    p.add_argument("--project-dir", default=".")

    p = add("list-models", data.cmd_list_models, "print the live OpenRouter model catalog")
    p.add_argument("--contains", default=None)
    p.add_argument("--limit", type=int, default=30)
    p.add_argument("--base-url", default=None, help="the API root whose /models is the catalog (default: "
                   "$FUGU_OPENROUTER_BASE_URL, else OpenRouter's https://openrouter.ai/api/v1)")

    p = add("generate", data.cmd_generate, "call every worker on every task and write the reward-matrix JSONL; "
            "exit status 3 when a cell failed (the failed cells are named; --resume calls them again)")
    p.add_argument("--workers", required=True)
    p.add_argument("--tasks", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks (check prompts, grading, billing)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run: only missing or failed cells are called")
    p.add_argument("--ledger", default=None, help="the cost ledger every paid call is appended to (default "
                   "data/ledger/costs.jsonl); `fugu-lite pack` puts it in the pack, whose receipt cites it")

    p = add("sample-data", sample.cmd_sample_data, "write a small routing sample with replies, offline: the mock "
            "worker pool's graded answers to the sample tasks (synthetic), with its worker YAML, as JSONL and tables")
    p.add_argument("--out", default="data/sample", help="the folder for routing.jsonl, workers.yaml, scores.csv, "
                   "calls.csv (default data/sample)")
    p.add_argument("--workers", default="configs/workers.mock.yaml", help="a pool of mock workers (default the "
                   "offline mock pool)")
    p.add_argument("--tasks", default="data/benchgen/sample.jsonl", help="a BenchGen batch file (default the "
                   "shipped sample)")
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    p.add_argument("--force", action="store_true", help="write over the files of an earlier sample")

    p = add("convert", data.cmd_convert, "write a BenchGen batch file from a standard benchmark (MATH-500, GSM8K, "
            "SVAMP, AIME24, AMC23, Minerva math, MMLU-STEM, HumanEval)")
    from fugu_pipeline.tasks.converters import add_arguments as convert_arguments

    convert_arguments(p)

    p = add("import", data.cmd_import, "convert real routing data into the reward-matrix JSONL")
    p.add_argument("kind", choices=["routellm-gsm8k", "routellm-mmlu", "routellm-mtbench", "routellm-csv", "dcrouter", "jsonl", "table", "long"])
    p.add_argument("path", help="the upstream file or folder")
    p.add_argument("--output", required=True)
    p.add_argument("--ledger", default=None, help="the cost ledger the import's recorded cost is appended to "
                   "(default data/ledger/costs.jsonl)")
    p.add_argument("--seed", type=int, default=None,
                   help="split assignment seed (default 0); a jsonl row that names its split keeps it")
    p.add_argument("--test-fraction", type=float, default=None,
                   help="routellm-*, table, long: share of prompts held out as test (default 0.3; the routing study's protocol uses 0.5); "
                        "jsonl: draw splits (test this share, default 0.3) for the rows without a 'split' field; "
                        "dcrouter's test split is its upstream test file")
    p.add_argument("--val-fraction", type=float, default=None,
                   help="share drawn as val (default 0.1): routellm-*, dcrouter, table, long, and a jsonl file's rows without a split")
    t = p.add_argument_group("table and long: CSV, TSV, Parquet or JSON Lines (optionally .gz). table: one row per prompt, "
                             "one column per worker's score in [0, 1]. long: one row per (prompt, worker) call")
    t.add_argument("--prompt-column", default=None, help="the prompt's column (default prompt): text, a conversation "
                   "(a list of role/content messages: its last user message, as serve routes it) or a list of turns (the first)")
    t.add_argument("--workers", default=None, help="table: the worker score columns, comma-separated; default auto: every "
                   "numeric or boolean column no other option names (the summary lists them). long and jsonl: the workers to "
                   "keep, in the file's order (default: every worker the file names)")
    t.add_argument("--domain-column", default=None, help="the domain's column (default: every row 'general')")
    t.add_argument("--split-column", default=None, help="the split's column (train, val, test); default: drawn, "
                   "--test-fraction 0.3 --val-fraction 0.1")
    t.add_argument("--id-column", default=None, help="the task id's column (table default <file>-<row>; long default: "
                   "tasks are told apart by their prompt, id <file>-<hash of the prompt>)")
    t.add_argument("--cost-column", default=None, help="table: each worker's cost column, a template with {worker}, "
                   "e.g. '{worker}|total_cost'. long: the call's cost column")
    t.add_argument("--answer-column", default=None, help="table: each worker's reply column, a template with {worker}, "
                   "e.g. '{worker}|model_response'. long: the call's reply column. Kept as the rows' answers (cascades read them)")
    t.add_argument("--drop-incomplete", action="store_true", help="leave out tasks missing a worker's score (default: refuse them)")
    t.add_argument("--test-file", default=None, help="a file of the same layout holding the test tasks (the main file's "
                   "are then train), as EmbedLLM ships train.csv and test.csv")
    t.add_argument("--val-file", default=None, help="a file of the same layout holding the val tasks")
    t.add_argument("--score-field", default=None, help="table: where a worker's column holds records (SPROUT's "
                   "{score, num_input_tokens, num_output_tokens, ...}), the field holding the score (default score)")
    t.add_argument("--prices", default=None, metavar="P.yaml", help="table: worker: {input: USD per M tokens, output: ...}; "
                   "each call's cost from its record's token counts (--input-tokens-field, --output-tokens-field)")
    t.add_argument("--input-tokens-field", default=None, help="table, with --prices: default num_input_tokens")
    t.add_argument("--output-tokens-field", default=None, help="table, with --prices: default num_output_tokens")
    t.add_argument("--score-range", default=None, metavar="LOW,HIGH", help="the scores' scale, mapped linearly onto "
                   "[0, 1]: a judge's 1-10 is --score-range 1,10 (default: scores are in [0, 1])")
    t.add_argument("--worker-column", default=None, help="long: the worker's (model's) column (default model)")
    t.add_argument("--score-column", default=None, help="long: the score's column, in [0, 1] (default score)")
    t.add_argument("--latency-column", default=None, help="long: the call's latency column, in seconds")
    t.add_argument("--prompts", default=None, help="long: a table of the tasks, one row per --id-column value, holding the "
                   "prompt (and the domain and split columns when named); the responses then need only id, worker, score")
    t.add_argument("--duplicates", choices=["refuse", "mean"], default=None, help="long: a (task, worker) pair given twice "
                   "is refused (default), or its scores, costs and latencies are averaged (repeated samples)")

    for method in ("sft", "rl", "es"):
        p = add(f"train-{method}", lambda a, m=method: training.train(a, m), f"train the {method.upper()} router head")
        p.add_argument("--config", default=None, help=f"trainer settings (default: configs/train_{method}.yaml when present, "
                       f"else the same built-in defaults; the router_{method} asset reads the same)")
        data_opts(p)
        if method != "sft":
            p.add_argument("--checkpoint", required=True, help="warm-start checkpoint: the path train-* printed, or the "
                           "--output folder of an earlier train-* (its latest checkpoint)")
        p.add_argument("--output", default="models", help="models folder: the checkpoint goes to <output>/<method>/<hash>/ "
                       "and its path is printed (pass that path, or this folder, to --checkpoint)")
        p.add_argument("--force", action="store_true", help="train even without a learning signal")
        if method == "sft":
            prompt_rules_opt(p)

    p = add("train", training.cmd_train_heads, "fit the configured heads (kNN, domain prior, ridge, MLP, ensemble, SFT) on a "
            "reward matrix, choose one by K-fold validation over the non-test rows, print its checkpoint directory last")
    p.add_argument("--config", default=None, help="heads and grids (default: configs/train.yaml when present, else the "
                   "same built-in defaults)")
    data_opts(p)
    p.add_argument("--output", default="models", help="models folder: each kind's best goes to <output>/<kind>/<hash>/")
    p.add_argument("--objective", choices=["oof", "lodo"], default=None, help="oof: K-fold over the non-test rows "
                   "(default); lodo: leave one domain out, for traffic from unseen domains")
    p.add_argument("--selection-rule", choices=["auto", "pooled", "macro", "blend"], default=None,
                   help="auto (default): the rule that holds up in the nested check")
    p.add_argument("--folds", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--force", action="store_true", help="train even without a learning signal")
    p.add_argument("--layer-sets", nargs="+", default=None, metavar="'L ...'",
                   help="encoder-layer settings to choose from, e.g. '-1' '-1 3' (or auto, off): the heads are fitted on "
                        "each and the one whose selected head has the best validation figure is kept (default: the "
                        "config's features.layer_sets, auto = [-1] and [-1, middle]; --layers fixes the layers)")
    p.add_argument("--no-lexical", dest="lexical", action="store_const", const=False,
                   help="leave out the lexical statistics block even where the config's features.lexical turns it "
                        "on (default: the config's, on)")
    prompt_rules_opt(p, default=None)
    p.add_argument("--cap", default=None, metavar="usd_per_1k=D|share=F", help="cascades: a cost cap for every domain, "
                   "dollars per 1,000 requests or a share of the strongest worker's cost, as route and serve take it "
                   "(default: the config's cascade.cap)")
    p.add_argument("--domain-cap", action="append", default=None, metavar="DOMAIN:share=F",
                   help="cascades: a cap for one domain (repeatable); that domain gets its own plan")
    p.add_argument("--per-domain", action="store_true", help="cascades: a plan per domain (with enough rows), not one for all")

    p = add("evaluate", training.cmd_evaluate, "write the held-out report of a checkpoint (JSON + plots)")
    p.add_argument("--checkpoint", required=True, help="the path train-* printed, or the --output folder it wrote to (its latest checkpoint)")
    data_opts(p)
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--output", default=None, help="report JSON path (default: <checkpoint>/reports/<split>.json)")
    p.add_argument("--models-dir", default="models", help="the king's folder: the composite's novelty is against its routes")
    p.add_argument("--tasks", default=None, help="BenchGen batch file or folder with the held-out tasks' graders, for the "
                   "composite's live term (needs --workers with workers; default: the project's data/benchgen, only when --data is "
                   "its data/reward_matrix.duckdb)")
    p.add_argument("--policy", default=None, help="promotion policy YAML (composite weights; default: configs/promotion.yaml)")
    budget_opts(p, "report the operating point for a cap, scored on --split: a one-step head at the λ chosen on "
                   "validation; a cascade as it serves requests asking the cap (the most accurate saved point within "
                   "it, as the spend guard allows)")

    harness.add_commands(add, data_opts)  # baseline, keygen, accept-key, collector-key, pack, preflight, validate, train-triage, triage-report

    p = add("evaluate-roles", roles.cmd_evaluate_roles, "the held-out multi-turn report of a coordinator on a "
            "project's tasks (vs the one-step router, the answer-aware cascade and the best fixed worker); --promote "
            "to face the king")
    p.add_argument("--project-dir", default=".")
    p.add_argument("--workers", default="configs/workers.mock.yaml", help="worker YAML, relative to the project")
    p.add_argument("--config", default="configs/train_roles.yaml", help="roles config (reward penalties, turn limit)")
    p.add_argument("--checkpoint", default=None, help="roles checkpoint (default: the promoted coordinator)")
    p.add_argument("--seeds", type=int, default=1, help="sampling seeds per held-out task")
    p.add_argument("--one-step", default=None, help="one-step checkpoint to compare with when none is promoted")
    p.add_argument("--cascade", default=None, metavar="PATH",
                   help="cascade checkpoint to compare with, run over the fixed workers' replies (default: the promoted "
                   "router when it is a cascade; none: the report says so)")
    p.add_argument("--promote", action="store_true", help="apply the promotion gates to models/promoted/roles.json")
    p.add_argument("--policy", default=None, help="promotion policy YAML, relative to the project (default: "
                   "configs/promotion.yaml if present)")
    p.add_argument("--replace-broken-king", action="store_true", help="with --promote: when the promoted coordinator "
                   "cannot be loaded, let this one replace it facing the baselines only (the history records the ask; "
                   "default: refuse and say why)")
    p.add_argument("--encoder", default=None, help="where to load the checkpoint's encoder from (default: its contract)")
    p.add_argument("--device", default="auto")

    p = add("route", routing.cmd_route, "route a prompt without calling any worker")
    route_opts(p)
    p.add_argument("--workers", default=None, metavar="YAML",
                   help="a worker YAML, so --allowed may name configured workers (and their aliases); nothing is called")

    p = add("ask", routing.cmd_ask, "route a prompt and call the chosen worker (falls back on failure)")
    route_opts(p)
    p.add_argument("--workers", required=True)
    p.add_argument("--mode", choices=["one-step", "multi-turn"], default="one-step",
                   help="multi-turn: the promoted coordinator (or --checkpoint, a roles checkpoint) delegates over "
                   "several turns (Thinker, Worker, Verifier) and answers with the committed answer")
    p.add_argument("--seed", type=int, default=0, help="multi-turn: the session's sampling seed")

    p = add("serve", routing.cmd_serve, "serve an OpenAI-compatible endpoint that routes every request")
    p.add_argument("--checkpoint", default=None, help="checkpoint directory, the --output folder of a train-* (its latest "
                   "checkpoint) or a models folder (its promoted pointer, followed; default: --models-dir's)")
    p.add_argument("--models-dir", default="models")
    p.add_argument("--workers", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--token", default=None, help="bearer token clients must send (default: $FUGU_SERVE_TOKEN; "
                   "prefer the variable: a flag is visible to other users in the process list)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch CPU threads for the encoder (default 1: "
                   "cheapest per request for small batches; raise it for a large encoder on idle cores; 0 = torch's default)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="encoder dtype (auto: the embedding step's rule, bf16 on GPUs and CPUs with native bf16)")
    p.add_argument("--max-body-bytes", type=int, default=2 << 20, help="larger request bodies get a 413")
    p.add_argument("--max-json-values", type=int, default=20_000, help="request bodies holding more JSON values "
                   "(strings, numbers, objects, lists, at any depth) get a 413")
    p.add_argument("--allowed-host", action="append", metavar="NAME", help="one more name clients may reach the "
                   "server by (the Host header; repeatable; '*.example.com' for its subdomains, '*' for any): other "
                   "names than the bound address's get a 400, against DNS rebinding")
    p.add_argument("--auth-cooldown-s", type=float, default=60.0, help="a worker whose key is refused (HTTP "
                   "401/402/403) is not called again for this long (0: called on every request)")
    p.add_argument("--batch-window-ms", type=float, default=3.0, help="how long a request waits for others to batch with")
    p.add_argument("--max-batch", type=int, default=32, help="prompts per routing batch (1: no batching)")
    p.add_argument("--shutdown-grace-s", type=float, default=5.0, help="on SIGTERM/SIGINT, how long replies in flight get "
                   "to finish; then a stream ends with a server_shutting_down error event, a plain request with a 503")
    limit_opts(p)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    budget_opts(p, "the server's default cap for requests that send no fugu_budget (nor fugu_cost_weight)")
    encoder_opts(p, features=False)
    return ap


def limit_opts(p) -> None:
    """`serve`'s connection and request limits: one flag per `ConnectionLimits` field, its default the field's."""
    from fugu_pipeline.serve.connections import LIMIT_HELP, ConnectionLimits

    g = p.add_argument_group("connections (docs/serving.md, 'Connections and slow clients')")
    for name, field in ConnectionLimits.model_fields.items():
        g.add_argument("--" + name.replace("_", "-"), type=field.annotation, default=field.default,
                       help=f"{LIMIT_HELP[name]} (default {field.default:g})")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # `fugu-lite` alone: the commands, not an error line
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        settings()  # a bad FUGU_* value is one line before the command does anything
        return args.func(args)
    except CLIError as exc:
        print(f"fugu-lite {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the project's own errors say what to do: no traceback for them
        if isinstance(exc, _user_errors()):
            print(f"fugu-lite {args.command}: {exc}", file=sys.stderr)
            return 2
        raise


def _user_errors() -> tuple[type[Exception], ...]:
    from fugu_pipeline.collect.store import PartitionBusyError
    from fugu_pipeline.evaluate.promotion import PolicyError
    from fugu_pipeline.features.routing_data import TrainingDataError
    from fugu_pipeline.features.settings import EncoderLoadError
    from fugu_pipeline.matrix.read import RewardMatrixError
    from fugu_pipeline.route.budget import BudgetError
    from fugu_pipeline.route.router import RouterError
    from fugu_pipeline.tasks.loading import TaskFileError
    from fugu_pipeline.train.checkpoints import CheckpointError
    from fugu_pipeline.config_files import ConfigError
    from fugu_pipeline.workers.catalog import CatalogError
    from fugu_pipeline.workers.config import WorkerConfigError
    from fugu_pipeline.workers.contract import WorkerCallError
    from fugu_pipeline.collector_key import CollectorKeyError
    from fugu_pipeline.ledger import LedgerError
    from fugu_pipeline.train.signing import SigningError

    return (CatalogError, CheckpointError, EncoderLoadError, RewardMatrixError, RouterError, TaskFileError,
            ConfigError, TrainingDataError, WorkerConfigError, WorkerCallError, PolicyError, BudgetError,
            PartitionBusyError, LedgerError, SigningError, CollectorKeyError, SettingsError)


if __name__ == "__main__":
    sys.exit(main())
