"""What a task that ran after others (``depends_on``) is told: its goal, then what each of them
returned, so the agent starts from their results (``queueing.endings.resolve`` moves the task).

A dependency's goal and result are text a user or a model wrote, so they are escaped as XML
(``&``, ``<``, ``>`` and, in the attribute, ``"``) and cut before escaping: a goal holding ``"``
or ``</dependency>`` cannot close its attribute or element and pass for text of this prompt.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from agentq.core.models import Task

RESULT_CHARS = 4000  # of each dependency's result, in the dependent's first message
GOAL_CHARS = 200  # of each dependency's goal


def dependency_goal(goal: str, dependencies: list[Task]) -> str:
    """The dependent's first message: its goal, then each dependency's goal and result."""
    if not dependencies:
        return goal
    parts = [goal, "", "Results of the tasks this one depends on (XML-escaped):"]
    for dep in dependencies:
        result = escape((dep.result or "")[:RESULT_CHARS])
        attrs = f"task_id={_attr(dep.task_id)} goal={_attr(dep.submission.goal[:GOAL_CHARS])}"
        parts.append(f"<dependency {attrs}>\n{result}\n</dependency>")
    return "\n".join(parts)


def _attr(value: str) -> str:
    """``value`` as a double-quoted XML attribute value, its line breaks escaped too, so the
    tag stays on one line whatever the goal holds."""
    return '"' + escape(value, {'"': "&quot;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}) + '"'
