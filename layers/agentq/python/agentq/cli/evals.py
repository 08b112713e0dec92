"""``agentq eval run DATASET --agent support@7 --against support@8``: a dataset run through two
versions of an agent on the real queue, graded, and reported side by side (docs/AGENTS.md).

Thin over the API: every item of each version is an ordinary ``POST /tasks`` (the tenant's
running limit, budgets and caps apply as to any task) with the idempotency key
``core.evaluations.item_key`` derives from (evaluation id, item, version), so a CLI killed at
any point and run again (the same command, or ``--resume EVAL_ID``) re-attaches to the tasks
already submitted and submits only the missing ones: within the key's 24 h no item runs twice
or is lost (a worker's death is the queue's: the task resumes). The report
(``core.evaluation_report``) is computed from the tasks' views alone: an item's cost and tokens
are its whole task tree's (the root's budget view), sub-agents included.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentq.cli.args import UsageError, add_command, at_least_one, seconds
from agentq.cli.target import api_client, remote
from agentq.core.errors import AgentqError
from agentq.core.evaluation_report import Outcome, render, report
from agentq.core.evaluations import EVAL_ID, EvalItem, evaluation_id, item_key, parse_dataset, pinned, submission

if TYPE_CHECKING:
    from agentq.api.client import Client

SIDES = ("agent", "against")
PROGRESS_EVERY = 10


def _say(text: str) -> None:
    print(f"agentq eval: {text}", file=sys.stderr, flush=True)


def _check_version(client: Client, ref: str, field: str) -> None:
    """The version exists in this tenant's catalogue, or a UsageError naming ``field``."""
    from agentq.api.client import NotFound

    name, version = pinned(ref, field)
    try:
        client.get_agent(name, version)
    except NotFound:
        try:
            latest = client.get_agent(name).version
        except NotFound:
            raise UsageError(f"{field}: there is no agent named {name!r}", field=field) from None
        raise UsageError(
            f"{field}: agent {name} has no version {version} (its latest is {latest})", field=field
        ) from None


def _submit_all(
    client: Client, items: list[EvalItem], eval_id: str, refs: dict[str, str], workers: int
) -> dict[tuple[str, str], str]:
    """Every item's task for each version: created, or found by its idempotency key.

    The first submission that fails (a line the API refuses, a line edited since, the API out of
    reach) stops the rest: no job sends once ``stop`` is set (on Ctrl-C the queued ones are
    cancelled too), so only those already in flight (at most ``workers``) end after it. Leaving
    a ``with ThreadPoolExecutor`` waits for every queued job: a run that had already failed went
    on submitting every line after the refused one, and each of those tasks ran and was paid
    for. What was submitted stays (a re-run with ``--resume`` re-attaches to it)."""
    from agentq.api.client import Conflict, InvalidRequest

    jobs = [(item, side) for item in items for side in SIDES]
    done: dict[tuple[str, str], str] = {}
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[BaseException] = []  # in the order they happened: the first is said
    created = 0

    def send(item: EvalItem, side: str) -> Any:
        body = submission(item, refs[side], eval_id)
        try:
            return client.submit(body, idempotency_key=item_key(eval_id, item.item_id, refs[side]))
        except Conflict as exc:  # a 409, as the API said it: the evaluation did not succeed (exit 1), not bad usage
            raise Conflict(
                exc.status,
                exc.code,
                f"dataset line {item.line} (item {item.item_id!r}): evaluation {eval_id} submitted this item to "
                f"{refs[side]} with another request (the line changed since); evaluate the new dataset under a new id",
                field=f"dataset:{item.line}",
            ) from None
        except InvalidRequest as exc:  # what only the API checks (an outcome against the agent's model)
            raise UsageError(
                f"dataset line {item.line} (item {item.item_id!r}), on {refs[side]}: {exc.message}",
                field=f"dataset:{item.line}:{exc.field}" if exc.field else f"dataset:{item.line}",
            ) from None

    def one(job: tuple[EvalItem, str]) -> None:
        nonlocal created
        if stop.is_set():
            return
        item, side = job
        try:
            accepted = send(item, side)
        except BaseException as exc:
            with lock:
                failures.append(exc)
            stop.set()
            return
        with lock:
            if not done:  # from here on there is something to re-attach to
                _say(f"re-run with --resume {eval_id} to re-attach")
            done[(item.item_id, side)] = accepted.task_id
            created += 1 if accepted.created else 0
            if len(done) % PROGRESS_EVERY == 0 or len(done) == len(jobs):
                _say(f"{eval_id}: submitted {len(done)}/{len(jobs)} ({created} new)")

    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        wait([pool.submit(one, job) for job in jobs])  # ``one`` raises nothing: a failure sets ``stop``
    except BaseException:  # Ctrl-C: nothing queued starts, the requests in flight end
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if failures:
        _stopped(failures[0], eval_id, len(done), len(jobs))
    return done


def _stopped(failure: BaseException, eval_id: str, submitted: int, jobs: int) -> None:
    """Raise the failure that stopped the submissions, saying what stays of the evaluation (its
    ``--resume`` offered only once something was submitted: otherwise there is nothing to
    re-attach to)."""
    from agentq.api.client import Conflict

    if isinstance(failure, AgentqError) and submitted:
        fix = "fix the line and " if (failure.field or "").startswith("dataset:") else ""
        resume = f" ({fix}run with --resume {eval_id} to re-attach to them and submit the rest)"
        failure.message += f"; submitting stopped there: the {submitted} of {jobs} tasks submitted stay" + (
            "" if isinstance(failure, Conflict) else resume  # an edited line: the same id refuses it again
        )
        failure.args = (failure.message,)
    raise failure


def _outcome(view: Any) -> Outcome:
    """An item's figures from its task's view. Cost and tokens are the whole task tree's (the
    root's budget view: its sub-agents' spend included), not the root's own calls only, or the
    version that delegates would look cheaper than it is; grading's cost is the root's grades'
    (shown apart, part of the cost). A task with no budget view (none was made) counts its own."""
    grade = view.grade
    started, finished = view.started_at, view.finished_at
    tree = view.budget
    return Outcome(
        task_id=view.task_id,
        status=view.status.value,
        result=view.result,
        score=None if grade is None else grade.score,
        cost_usd=Decimal(tree.cost_usd if tree is not None else view.cost_usd),
        grade_cost_usd=Decimal(grade.cost_usd) if grade is not None else Decimal(0),
        tokens_in=tree.tokens_in if tree is not None else view.tokens.input,
        tokens_out=tree.tokens_out if tree is not None else view.tokens.output,
        steps=view.step,
        llm_steps=view.llm_steps,
        duration_s=(finished - started) if started is not None and finished is not None else None,
    )


def _wait_all(client: Client, tasks: dict[tuple[str, str], str], timeout: float, poll: float) -> dict[str, Any]:
    """Each task's view once it has ended (polled; only the ones still running are read again)."""
    from agentq.api.client import TERMINAL, WaitTimeout

    pending = set(tasks.values())
    ended: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while pending:
        for task_id in sorted(pending):
            view = last = client.get(task_id)
            if view.status.value in TERMINAL:
                ended[task_id] = view
                pending.discard(task_id)
                if len(ended) % PROGRESS_EVERY == 0 or not pending:
                    _say(f"ended {len(ended)}/{len(tasks)}")
        if pending:
            if time.monotonic() > deadline:
                raise WaitTimeout(
                    f"{len(pending)} tasks of the evaluation have not ended after {timeout:g}s (one: {last.task_id}, "
                    f"{last.status.value}); run it again to re-attach",
                    last,
                )
            time.sleep(poll)
    return ended


def fail_under(value: str) -> float:
    """0.8 or 80%: the lowest pass rate of --against that exits 0."""
    try:
        rate = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a pass rate, 0.8 or 80%, not {value!r}") from None
    if not 0 <= rate <= 1:
        raise argparse.ArgumentTypeError(f"a pass rate from 0 to 1 (or 0% to 100%), not {value!r}")
    return rate


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        data = Path(args.dataset).read_bytes()
        text = data.decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"dataset: cannot read {args.dataset}: {exc}", field="dataset") from None
    items = parse_dataset(text)  # every line checked before anything is submitted
    pinned(args.agent, "agent")
    pinned(args.against, "against")
    if args.agent == args.against:
        raise UsageError("against: the same version as --agent; compare two versions", field="against")
    eval_id = args.resume or evaluation_id(data, args.agent, args.against)
    if not EVAL_ID.match(eval_id):
        raise UsageError(f"resume: an evaluation id is 1-64 letters, digits, _ or -, not {eval_id!r}", field="resume")
    client = api_client(args)
    for ref, field in ((args.agent, "agent"), (args.against, "against")):
        _check_version(client, ref, field)
    refs = {"agent": args.agent, "against": args.against}
    _say(f"evaluation {eval_id}: {len(items)} items x 2 versions ({args.agent}, {args.against})")
    started = time.monotonic()
    tasks = _submit_all(client, items, eval_id, refs, args.submitters)
    views = _wait_all(client, tasks, args.timeout, args.poll)
    outcomes = {side: {i.item_id: _outcome(views[tasks[(i.item_id, side)]]) for i in items} for side in SIDES}
    result = report(eval_id, args.agent, args.against, items, outcomes["agent"], outcomes["against"])
    result["wall_s"] = round(time.monotonic() - started, 3)
    report_path = Path(args.report or f"eval-{eval_id}.json")
    report_path.write_text(json.dumps(result, indent=2) + "\n")
    _say(f"report: {report_path}")
    if not args.no_plot:
        from agentq.cli.eval_plot import draw

        drawn = draw(result, Path(args.plot or f"eval-{eval_id}.png"))
        _say(f"plot: {drawn}" if isinstance(drawn, Path) else drawn)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
    if args.fail_under is not None:
        rate = result["summary"]["against"]["pass_rate"]
        if rate < args.fail_under:
            _say(f"{args.against} passed {rate:.1%}, under --fail-under {args.fail_under:.1%}")
            return 1
    return 0


def register(sub: Any) -> None:
    group = add_command(sub, "eval", "evaluate agent versions over a dataset")
    eval_sub = group.add_subparsers(dest="eval_command", required=True, metavar="ACTION")
    run = remote(
        eval_sub.add_parser(
            "run",
            help="run a dataset through two agent versions and report them side by side",
            description="Each line of DATASET (JSONL) is an item: goal (required), id, inputs (submission fields), "
            "outcome or rubric, expected (the exact answer). Every item runs once on each version as an ordinary "
            "task, graded by its outcome (the item's, else the agent's); an item passes when its task succeeded "
            "(and answered `expected`, if given). The report: pass rate with a 95% Wilson interval, cost, tokens, "
            "steps, duration, the items that changed. Killed and run again (or --resume EVAL_ID), it re-attaches "
            "to the tasks it submitted: no item runs twice.",
        ),
        json_help="print the report as JSON",
    )
    run.add_argument("dataset", help="a JSONL file, one item a line")
    run.add_argument("--agent", required=True, help="the baseline version, name@N")
    run.add_argument("--against", required=True, help="the candidate version, name@N")
    run.add_argument("--resume", metavar="EVAL_ID", help="the evaluation to re-attach to (default: the dataset's "
                     "and versions' digest, so the same command re-attaches)")  # fmt: skip
    run.add_argument("--fail-under", type=fail_under, metavar="RATE",
                     help="exit 1 when --against passes less than RATE (0.8 or 80%%): for CI")  # fmt: skip
    run.add_argument("--report", help="where to write the JSON report (default eval-EVAL_ID.json)")
    run.add_argument("--plot", help="where to draw the PNG (default eval-EVAL_ID.png; needs matplotlib)")
    run.add_argument("--no-plot", action="store_true", help="draw no PNG")
    # Read as the arguments are parsed (exit 2 naming the option), before anything is submitted: a
    # negative --poll was taken, every item submitted and paid for, and the wait died in time.sleep.
    run.add_argument("--timeout", type=seconds, default=3600.0, help="seconds to wait for the tasks (default 3600)")
    run.add_argument("--poll", type=seconds, default=1.0, help="seconds between reads of the running tasks")
    run.add_argument("--submitters", type=at_least_one, default=4, help="submissions in flight at once (default 4)")
    run.set_defaults(func=_cmd_run)
