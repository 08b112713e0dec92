"""What a task that ran after others (``depends_on``) is told: its goal, then what each of them
returned, so the agent starts from their results (``queueing.dependencies`` moves the task)."""

from __future__ import annotations

from agentq.core.models import Task

RESULT_CHARS = 4000  # of each dependency's result, in the dependent's first message


def dependency_goal(goal: str, dependencies: list[Task]) -> str:
    """The dependent's first message: its goal, then each dependency's goal and result."""
    if not dependencies:
        return goal
    parts = [goal, "", "Results of the tasks this one depends on:"]
    for dep in dependencies:
        result = (dep.result or "")[:RESULT_CHARS]
        parts.append(
            f'<dependency task_id="{dep.task_id}" goal="{dep.submission.goal[:200]}">\n{result}\n</dependency>'
        )
    return "\n".join(parts)
