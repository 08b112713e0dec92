"""A workspace that starts from a git repository (``WorkspaceSpec.git``): cloned at the task's
first claim, in the workspace's own sandbox, through the task's egress proxy, so the clone
reaches only a host the task allows and only where the SSRF guard lets it (the same path as a
``git clone`` the agent runs with ``shell``).

The clone either becomes the task's starting files whole or the task fails with a precise code
(``core.workspace.WorkspaceSourceFailed`` and its kinds): a host the proxy refuses or a
repository that is not there (``workspace_git_failed``), a ref the repository does not have
(``workspace_git_ref_not_found``), a repository past the task's limits
(``workspace_git_too_large``). Nothing of a failed clone is recorded, and a clone is recorded
once (``_workspace.Workspaces`` stores its content, then its manifest, then the fenced META
write): a claim that dies mid-clone leaves nothing, and the next claim clones afresh into a new
directory; a claim after the record restores it instead of cloning, so a branch that moved
since changes nothing the task runs on.

The URL and the ref reach the script as environment variables, never spliced into the command:
a ref was checked against ``core.workspace.GIT_REF`` (never an option), the URL against
``git_host`` (http or https, no credentials), and ``--`` ends git's options before the URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentq.core.workspace import GitSource, WorkspaceRefNotFound, WorkspaceSourceFailed

CLONE_SECONDS = 600.0
NO_REF = 11

CLONE_SCRIPT = r"""
set -u
git -c init.defaultBranch=main clone -q --no-checkout -- "$AGENTQ_GIT_URL" . >&2 || exit 10
ref="${AGENTQ_GIT_REF:-}"
if [ -z "$ref" ]; then
  git reset -q --hard >&2 || exit 12
elif git rev-parse -q --verify "refs/remotes/origin/$ref^{commit}" >/dev/null; then
  git checkout -q -B "$ref" "origin/$ref" >&2 || exit 12
elif commit=$(git rev-parse -q --verify "$ref^{commit}"); then
  git -c advice.detachedHead=false checkout -q --detach "$commit" >&2 || exit 12
else
  echo "the repository has no branch, tag or commit $ref" >&2
  exit 11
fi
"""


def clone(sandbox: Any, directory: Path, source: GitSource, egress: Any) -> None:
    """Clone ``source`` into the empty ``directory``; ``WorkspaceSourceFailed`` otherwise.
    ``egress``: the task's proxy (None: this worker has none, so nothing can be fetched)."""
    if egress is None:
        raise WorkspaceSourceFailed(
            "workspace.git: this worker has no egress proxy, so no repository can be cloned", field="workspace.git"
        )
    result = sandbox.shell(
        directory,
        CLONE_SCRIPT,
        CLONE_SECONDS,
        egress=egress.path,
        env={"AGENTQ_GIT_URL": source.url, "AGENTQ_GIT_REF": source.ref or "", "GIT_TERMINAL_PROMPT": "0"},
    )
    said = (result.stderr or result.stdout or "").strip()[-600:]
    refused = "; ".join(list(egress.refused)[-3:])
    if result.timed_out:
        raise WorkspaceSourceFailed(
            f"workspace.git: cloning {source.url} took over {CLONE_SECONDS:.0f}s", field="workspace.git"
        )
    if result.exit_code == NO_REF:
        raise WorkspaceRefNotFound(
            f"workspace.git.ref: {source.url} has no branch, tag or commit {source.ref!r}", field="workspace.git.ref"
        )
    if result.exit_code != 0:
        why = f" (the egress proxy refused: {refused})" if refused else ""
        raise WorkspaceSourceFailed(
            f"workspace.git.url: could not clone {source.url}{why}: {said or result.exit_code}",
            field="workspace.git.url",
        )
