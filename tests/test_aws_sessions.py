"""runtime.session (agentq/aws_sessions.py): one boto3 session per process and setting, every
caller's clients its own; a changed key or credentials file is used by the next client; a
forked child makes its own; every session shares one botocore data loader."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from agentq import aws_sessions
from agentq.runtime import Settings, client, session

from tests.helpers import in_forked_child

SETTINGS = Settings(table="t", bucket="b", endpoint_url="http://127.0.0.1:9")


class Sent(Exception):
    """Raised in place of sending: carries the request's Authorization header."""


def signed_with(sqs: Any) -> str:
    """The access key id a client signs its next request with (read from the request itself)."""

    def stop(request: Any, **_: Any) -> None:
        raise Sent(request.headers["Authorization"].decode() if isinstance(request.headers["Authorization"], bytes)
                   else request.headers["Authorization"])  # fmt: skip

    sqs.meta.events.register("before-send.sqs.ListQueues", stop)
    with pytest.raises(Sent) as sent:
        sqs.list_queues()
    return str(sent.value).split("Credential=", 1)[1].split("/", 1)[0]


@pytest.fixture
def own_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A setting no other test of the process has (a key of this test's own), no files on disk,
    nothing else of the runner's AWS configuration (a profile, a role to assume)."""
    for name in [k for k in os.environ if k.startswith(("AWS_", "BOTO_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", f"AKIA{os.urandom(6).hex().upper()}")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))


def test_one_session_per_setting_and_each_caller_gets_a_client_with_hooks_of_its_own(own_setting: None) -> None:
    assert session(SETTINGS) is session(SETTINGS)
    first, second = client(SETTINGS, "sqs"), client(SETTINGS, "sqs")
    assert first is not second
    seen: list[str] = []
    first.meta.events.register("before-send.sqs.*", lambda **_: seen.append("first"))
    signed_with(second)  # the second's request: the first's hook does not see it
    assert seen == []
    assert session(Settings(table="t", bucket="b", region="eu-west-1")) is not session(SETTINGS)


def test_a_changed_key_in_the_environment_signs_the_next_client_s_requests(
    own_setting: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = client(SETTINGS, "sqs")
    old = os.environ["AWS_ACCESS_KEY_ID"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAROTATEDKEY000001")
    assert signed_with(client(SETTINGS, "sqs")) == "AKIAROTATEDKEY000001"
    assert signed_with(before) == old  # a client made before keeps the key it was made with


def test_a_rewritten_credentials_file_signs_the_next_client_s_requests(
    own_setting: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    credentials = tmp_path / "credentials"
    for n, key in enumerate(("AKIAFROMTHEFILE00001", "AKIAFROMTHEFILE00002")):  # rewritten in place, same size
        credentials.write_text(f"[default]\naws_access_key_id = {key}\naws_secret_access_key = s\n")
        os.utime(credentials, ns=(n, n))  # distinct times whatever the file system's resolution
        assert signed_with(client(SETTINGS, "sqs")) == key
    renamed = tmp_path / "credentials.new"  # replaced whole, as tools that rotate keys do
    renamed.write_text("[default]\naws_access_key_id = AKIAFROMTHEFILE00003\naws_secret_access_key = s\n")
    os.replace(renamed, credentials)
    assert signed_with(client(SETTINGS, "sqs")) == "AKIAFROMTHEFILE00003"


def test_clients_asked_for_at_once_by_many_threads_are_made_one_at_a_time_and_whole(
    own_setting: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """boto3's sessions are not thread-safe (botocore builds its components lazily, on a
    session's first clients): the shared session makes one client at a time."""
    making, most = [0], [0]
    count = threading.Lock()
    make = boto3.session.Session.client

    def slow_make(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self is not ours:  # another thread of the process, on a session of its own
            return make(self, *args, **kwargs)
        with count:
            making[0] += 1
            most[0] = max(most[0], making[0])
        try:
            time.sleep(0.005)  # long enough for the other threads to come in, if they may
            return make(self, *args, **kwargs)
        finally:
            with count:
                making[0] -= 1

    ours = session(SETTINGS)
    monkeypatch.setattr(boto3.session.Session, "client", slow_make)
    made: list[Any] = []
    failed: list[BaseException] = []
    start = threading.Barrier(16)

    def ask() -> None:
        start.wait()
        try:
            made.append(client(SETTINGS, "dynamodb"))
        except BaseException as exc:  # the test reports what a thread met
            failed.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == [] and len({id(c) for c in made}) == 16 and most == [1]
    assert all(c.meta.service_model.service_name == "dynamodb" for c in made)


@pytest.mark.parametrize("held_lock", ["the session's", "the module's"])
def test_a_forked_child_makes_clients_though_a_parent_thread_held_a_lock_at_the_fork(
    own_setting: None, held_lock: str
) -> None:
    shared = aws_sessions.shared_session(SETTINGS.region)
    lock = shared._making if held_lock == "the session's" else aws_sessions._lock
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:  # a parent thread in the middle of making a client, or of finding its session
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()

    def in_child() -> None:
        made = client(SETTINGS, "sqs")
        assert session(SETTINGS) is not shared and made.meta.service_model.service_name == "sqs"

    try:
        in_forked_child(in_child, seconds=10)
    finally:
        release.set()
        holder.join()


def test_sessions_share_one_data_loader_whose_search_path_stays_the_same() -> None:
    first = session(SETTINGS)
    loader = first._session.get_component("data_loader")
    paths = list(loader.search_paths)
    others = [session(Settings(table="t", bucket="b", region=r)) for r in ("eu-west-1", "us-west-2", "ap-south-1")]
    assert all(s._session.get_component("data_loader") is loader for s in others)
    assert loader.search_paths == paths  # boto3 adds its data folder per session: not again and again
    assert len(set(paths)) == len(paths)
    sqs = others[0].client("sqs", endpoint_url=SETTINGS.endpoint_url)
    assert sqs.meta.service_model.service_name == "sqs" and sqs.meta.region_name == "eu-west-1"


def test_at_most_the_shared_number_of_settings_are_kept_the_least_recently_used_forgotten(
    own_setting: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def for_key(n: int) -> Any:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", f"AKIAKEPT{n:012d}")
        return session(SETTINGS)

    first, second = for_key(0), for_key(1)
    for n in range(2, aws_sessions.SHARED_SESSIONS + 1):
        for_key(n)
        assert for_key(0) is first  # used again: kept, where the second is the one forgotten
    assert aws_sessions._session.cache_info().currsize == aws_sessions.SHARED_SESSIONS
    assert for_key(1) is not second
