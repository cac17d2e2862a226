"""``medomni bench …``: run a task set with an agent, score the runs, import run folders.

Folders default to the workspace's (``workspace.yaml``: ``studio``, ``bench``, ``runs``).
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from medomni_cas import porcelain
from medomni_cas.bench.harness import (
    RERUNS,
    CheckFailed,
    Interrupted,
    JobReport,
    LeaseLost,
    RunReport,
    report_json,
)
from medomni_cas.bench.harness.claims import DEFAULT_LEASE
from medomni_cas.bench.runfolders import import_run_folder
from medomni_cas.bench.runners import runner_names
from medomni_cas.bench.scorer import PartialScore, row_dicts
from medomni_cas.cli._output import (
    EXIT_OK,
    EXIT_PROBLEM,
    add_command,
    common_options,
    emit,
    json_mode,
    open_store,
    to_builtins,
    workspace_folders,
)
from medomni_cas.cli._progress import bars
from medomni_cas.cli.studio import shard_arg
from medomni_cas.porcelain import format_value
from medomni_cas.studio.arms import arm_label

__all__ = ["register"]


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise ValueError(
            f"--runner-option wants KEY=VALUE, such as environment=docker; got {text!r}"
        )
    return key, value


def cmd_run(args: argparse.Namespace) -> int:
    """Check the set, then run every slot that has no run yet (resuming is running again)."""
    folders = workspace_folders()
    agent = porcelain.agent_config(args.agent, folders=folders, bench=args.bench)
    stopped: Interrupted | LeaseLost | None = None
    with open_store(args) as store:
        try:
            report = porcelain.run(
                store,
                args.name,
                agent,
                folders=folders,
                runner=args.runner,
                runner_options=dict(_option(o) for o in args.runner_option or ()),
                arms=args.arm,
                studio=args.studio,
                bench=args.bench,
                runs_dir=args.runs,
                progress=bars(args),
                reps=args.reps,
                accept_conditions=args.accept_conditions,
                max_attempts=args.max_attempts,
                budget=args.budget,
                shard=args.shard,
                rerun=args.rerun,
                fail_fast=args.fail_fast,
                claim_timeout=args.claim_timeout,
                concurrency=args.concurrency,
            )
        except CheckFailed as e:
            sys.stderr.write(f"medomni: {e}\n")
            if json_mode(args):
                emit(args, {"error": {"type": "CheckFailed", "problems": e.problems}}, "")
            return EXIT_PROBLEM
        except (Interrupted, LeaseLost) as e:
            # stopped: the claims are released and what finished is recorded; say what
            stopped = e
            if e.report is None:
                sys.stderr.write(f"medomni: {e}; nothing was run\n")
                return e.exit_status if isinstance(e, Interrupted) else EXIT_PROBLEM
            report = e.report
    _print_run(args, report, stopped)
    if isinstance(stopped, Interrupted):
        return stopped.exit_status
    return EXIT_OK if stopped is None and report.complete else EXIT_PROBLEM


def _print_run(
    args: argparse.Namespace, report: RunReport, stopped: Interrupted | LeaseLost | None
) -> None:
    for notice in report.notices:
        sys.stderr.write(f"medomni: {notice}\n")
    jobs = [msgspec.json.decode(report_json(j)) for j in report.jobs]
    data: dict[str, object] = {
        "task_set": report.task_set,
        "agent_config": report.agent_config,
        "complete": report.complete,
        "jobs": jobs,
    }
    lines = [_job_line(j) for j in report.jobs]
    for j in report.jobs:
        if j.stopped:
            lines.append(f"{j.name}: stopped after {args.fail_fast} runs failed alike: {j.stopped}")
    lines.append(f"{report.ran} runs in {len(report.jobs)} jobs")
    if stopped is not None:
        # on stderr too: under --json the reason would otherwise be lost
        sys.stderr.write(f"medomni: {stopped}; claims released, the runs that finished recorded\n")
        data["stopped"] = str(stopped)
    elif not report.complete:
        lines.append("not every slot asked for has a final run with an answer (see above): exit 1")
    emit(args, to_builtins(data), lines)


def _job_line(j: JobReport) -> str:
    parts = [f"{j.ran} run now", f"{j.done} already done"]
    if j.held:
        who = sorted(set(j.held))
        parts.append(f"{len(j.held)} held by another harness ({', '.join(who[:3])})")
    if j.outside_shard:
        parts.append(f"{j.outside_shard} outside this shard")
    if j.never_run:
        parts.append(f"{j.never_run} never run")
    failed = {o: n for o, n in j.outcomes.items() if o != "answered"}
    if failed:
        parts.append("without an answer: " + ", ".join(f"{n} {o}" for o, n in failed.items()))
    unmet = j.unanswered - sum(failed.values())
    if unmet:
        parts.append(f"{unmet} answered without the encoders the arm requires")
    if j.infra_errors:
        parts.append(f"{j.infra_errors} infrastructure errors now (run again to retry)")
    return f"{j.name}: " + ", ".join(parts)


def cmd_score(args: argparse.Namespace) -> int:
    """Score the set's recorded runs; write results.json and results.parquet."""
    out = workspace_folders().results(args.name, args.out)
    with open_store(args) as store:
        try:
            report = porcelain.score(
                store,
                args.name,
                agents=args.agent,
                n_boot=args.n_boot,
                seed=args.seed,
                out=out,
                allow_partial=args.allow_partial,
                arms=args.arm,
                plots=args.plots,
            )
        except PartialScore as e:
            sys.stderr.write(f"medomni: {e}\n")
            if json_mode(args):
                gaps = [to_builtins(g.__dict__) for g in e.gaps]
                emit(args, {"error": {"type": "PartialScore", "gaps": gaps}}, "")
            return EXIT_PROBLEM
    rows = report.scored.record.rows
    head = (
        f"{'agent':<16} {'arm':<24} {'pair':<32} {'target':<12} {'metric':<10} {'value':>7}  95% CI"
    )
    lines = [head]
    for r in rows:
        arm = arm_label(r.arm, r.arm_variant)
        unanswered = sum(r.unanswered.values())
        lines.append(
            f"{r.agent:<16} {arm:<24} {r.pair:<32} {r.target:<12} {r.metric:<10} "
            f"{format_value(r.value):>7}  [{format_value(r.ci_low)}, {format_value(r.ci_high)}]"
            + (f"  n={r.n}" + (f" missing={r.n_missing}" if r.n_missing else ""))
            + (f"  PARTIAL: {r.never_run} of {r.expected} never run" if r.partial else "")
            + (
                "  unanswered: " + ", ".join(f"{n} {o}" for o, n in r.unanswered.items())
                if unanswered
                else ""
            )
            + (f"  ! {r.config_flag}" if r.config_flag else "")
            + (f"  ! {r.run_flag}" if r.run_flag else "")
        )
    paths = report.files
    partial = " (PARTIAL: some slots never ran)" if report.scored.record.partial else ""
    lines.append(f"result {report.result.hex()}{partial} -> {', '.join(str(p) for p in paths)}")
    data = {
        "result": report.result,
        "partial": report.scored.record.partial,
        "files": [str(p) for p in paths],
        "rows": row_dicts(rows),
    }
    emit(args, to_builtins(data), lines)
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    """Paired contrasts between arms; write comparisons.json/.parquet and the plots."""
    from medomni_cas.bench.contrasts import comparison_lines, contrast_dicts

    out = workspace_folders().results(args.name, args.out)
    with open_store(args) as store:
        report = porcelain.compare(
            store,
            args.name,
            arms=args.arms,
            agents=args.agent,
            n_boot=args.n_boot,
            seed=args.seed,
            out=out,
            plots=not args.no_plots,
        )
    record = report.compared.record
    lines = comparison_lines(report.comparison, record)
    lines.append("wrote " + ", ".join(str(p) for p in report.files))
    data = {
        "comparison": report.comparison,
        "files": [str(p) for p in report.files],
        "rows": contrast_dicts(record.rows),
    }
    emit(args, to_builtins(data), lines)
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    """Read a run folder's records into the store (each re-hashed against its id)."""
    with open_store(args, create=True) as store:
        jid = import_run_folder(store, args.folder)
    emit(args, to_builtins({"job": jid}), f"imported job {jid.hex()}")
    return EXIT_OK


def cmd_agent_check(args: argparse.Namespace) -> int:
    """Load an agent config, list its fields, resolve its route, send one tiny request."""
    from medomni_cas.bench.agent_check import check_agent

    agent = porcelain.agent_config(args.config, folders=workspace_folders(), bench=args.bench)
    check = check_agent(agent, timeout=args.timeout)
    width = max(len(f.name) for f in check.fields)
    lines = [f"agent config {agent.name}"]
    for f in check.fields:
        lines.append(f"  {f.name:<{width}}  {f.value}")
        lines.append(f"  {'':<{width}}    {f.meaning}")
    ep = check.endpoint
    if ep is not None and ep.url:
        where = ", ".join(ep.addresses) or "unresolved"
        verdict = "local" if ep.local else "not local"
        lines.append(f"endpoint host {ep.host or '-'}: {where} ({verdict}; route {agent.route})")
    if check.latency_ms is not None and check.served_model:
        lines.append(
            f"served model {check.served_model!r} (config: {agent.served_model!r}), "
            f"latency {check.latency_ms:.0f} ms, tokens {check.tokens_in} in / "
            f"{check.tokens_out} out"
            + (f", ${check.cost_usd:g}" if check.cost_usd is not None else "")
        )
    lines += [f"note: {n}" for n in check.notices]
    lines += [f"PROBLEM: {p}" for p in check.problems]
    lines.append("ok" if check.ok else f"{len(check.problems)} problem(s): exit 1")
    data = {
        "agent": agent.name,
        "fields": [vars(f) for f in check.fields],
        "endpoint": None if ep is None else {**vars(ep), "local": ep.local},
        "served_model": check.served_model,
        "latency_ms": check.latency_ms,
        "tokens_in": check.tokens_in,
        "tokens_out": check.tokens_out,
        "cost_usd": check.cost_usd,
        "reply": check.reply,
        "notices": check.notices,
        "problems": check.problems,
        "ok": check.ok,
    }
    emit(args, to_builtins(data), lines)
    return EXIT_OK if check.ok else EXIT_PROBLEM


def register(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench`` and its verbs to the top-level subcommands."""
    p = groups.add_parser(
        "bench", help="run task sets with agents and score them", parents=[common_options()]
    )
    p.set_defaults(handler=None, parser=p)
    verbs = p.add_subparsers(title="verbs", metavar="VERB")

    r = add_command(verbs, "run", cmd_run, "check a task set, then run it (or resume)")
    r.add_argument("name", metavar="BENCHMARK/SET")
    r.add_argument(
        "--agent",
        required=True,
        help="an agent config: a name under bench/agents/ or a path to its YAML file",
    )
    r.add_argument("--arm", action="append", metavar="ARM", help="run only this arm (repeatable)")
    r.add_argument("--reps", type=int, default=1, help="repetitions of each atom task")
    r.add_argument(
        "--runner",
        default=None,
        choices=runner_names(),
        help="how agents run (default: the runner of the agent config's scaffold: process for "
        "a command, replay for replay, harbor for a Harbor agent)",
    )
    r.add_argument(
        "--runner-option",
        action="append",
        metavar="KEY=VALUE",
        help="a setting of the runner, such as environment=daytona for harbor (repeatable)",
    )
    r.add_argument(
        "--accept-conditions",
        action="store_true",
        help="you meet the conditions a dataset sets on this route",
    )
    r.add_argument(
        "--max-attempts",
        type=int,
        default=3,
        help="runs per slot when the infrastructure fails (default 3)",
    )
    r.add_argument(
        "--rerun",
        choices=RERUNS,
        help="run the chosen slots again, a new attempt linked from the last: infra "
        "(infrastructure errors), failed (also agent-failed, timeout), unanswered (every "
        "slot without a scored answer) or all",
    )
    r.add_argument(
        "--fail-fast",
        type=int,
        default=5,
        metavar="K",
        help="stop a job when its first K runs all end without an answer with the same "
        "error (default 5; 0: never)",
    )
    r.add_argument("--budget", type=int, default=8, help="encoder calls per atom task")
    r.add_argument(
        "--claim-timeout",
        type=float,
        default=DEFAULT_LEASE,
        metavar="SECONDS",
        help="this harness's lease: how long other harnesses wait for its heartbeat before "
        f"they take its slots over (default {DEFAULT_LEASE:g})",
    )
    r.add_argument(
        "--shard",
        type=shard_arg,
        metavar="I/N",
        help="run only the slots of shard I of N (0-based); machines can share a set",
    )
    r.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="trials run at once, each isolated as alone (default: the number of cores)",
    )
    for opt in ("studio", "bench", "runs"):
        r.add_argument(f"--{opt}", metavar="DIR", help=f"{opt} folder (default: the workspace's)")

    s = add_command(verbs, "score", cmd_score, "score the recorded runs of a task set")
    s.add_argument("name", metavar="BENCHMARK/SET")
    s.add_argument("--agent", action="append", help="only this agent config (repeatable)")
    s.add_argument(
        "--arm",
        action="append",
        metavar="ARM",
        help="score only this arm (repeatable; default: every arm of the set)",
    )
    s.add_argument(
        "--out",
        metavar="DIR",
        help="where results.json/.parquet go (default: results/<set>/ in the workspace)",
    )
    s.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    s.add_argument(
        "--allow-partial",
        action="store_true",
        help="score even when some slots have no final run (the rows say partial)",
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--plots",
        action="store_true",
        help="also write per-class confusion plots (PNG and SVG) beside the results",
    )

    i = add_command(verbs, "import", cmd_import, "read a run folder into the store")
    i.add_argument("folder", metavar="FOLDER")

    a = verbs.add_parser("agent", help="test an agent config", parents=[common_options()])
    a.set_defaults(handler=None, parser=a)
    agent_verbs = a.add_subparsers(title="verbs", metavar="VERB")
    c = add_command(
        agent_verbs,
        "check",
        cmd_agent_check,
        "list an agent config's fields, resolve its route, send one tiny request to its "
        "endpoint and print the served model, latency and tokens (exit 1 when anything "
        "does not match)",
    )
    c.add_argument("config", metavar="CONFIG", help="a name under bench/agents/ or a YAML file")
    c.add_argument("--bench", metavar="DIR", help="bench folder (default: the workspace's)")
    c.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="for the request")

    m = add_command(
        verbs, "compare", cmd_compare, "paired contrasts between arms, with intervals and tests"
    )
    m.add_argument("name", metavar="BENCHMARK/SET")
    m.add_argument(
        "--arms",
        nargs=2,
        metavar=("A", "B"),
        help="one contrast, A - B (arm labels such as encoders, modality-ladder.r2); default: "
        "encoders - no-perception, encoders-required - encoders, and each ladder rung against "
        "the one before and against r1",
    )
    m.add_argument("--agent", action="append", help="only this agent config (repeatable)")
    m.add_argument(
        "--out",
        metavar="DIR",
        help="where comparisons.json/.parquet and the plots go (default: results/<set>/)",
    )
    m.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--no-plots", action="store_true", help="write no PNG/SVG plots")
