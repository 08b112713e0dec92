"""`agentq download ID DIR` into a DIR that cannot be made (under /proc, under a file, where the
user may not write) is refused naming DIR and ``directory``, exit 2, before anything is asked of
the API; mkdir's OSError was a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests import fake_api
from tests.fake_api import Ran

agentq = fake_api.agentq
NOWHERE = "http://127.0.0.1:9"  # nothing answers: a request sent would be "cannot reach", exit 1


def test_download_into_a_directory_that_cannot_be_made_is_refused_naming_it_with_exit_2(
    agentq: Callable[..., Ran], tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("x")
    for directory in ("/proc/agentq-download", str(tmp_path / "a-file" / "sub")):
        ran = agentq(NOWHERE, "download", "t1", directory)
        assert ran.returncode == 2, ran
        assert directory in ran.stderr and ran.stderr.rstrip().endswith("(directory)"), ran.stderr
