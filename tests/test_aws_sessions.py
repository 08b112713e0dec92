"""runtime.session: every session of a process shares one botocore data loader (the parsed
service models and endpoint data), and making sessions does not grow it."""

from __future__ import annotations

from agentq.runtime import Settings, session


def test_sessions_share_one_data_loader_whose_search_path_stays_the_same() -> None:
    settings = Settings(table="t", bucket="b", endpoint_url="http://127.0.0.1:9")
    first = session(settings)
    loader = first._session.get_component("data_loader")
    paths = list(loader.search_paths)
    later = [session(settings) for _ in range(5)]
    assert all(s._session.get_component("data_loader") is loader for s in later)
    assert loader.search_paths == paths  # boto3 adds its data folder per session: not again and again
    assert len(set(paths)) == len(paths)
    sqs = later[-1].client("sqs", endpoint_url=settings.endpoint_url)
    assert sqs.meta.service_model.service_name == "sqs" and sqs.meta.region_name == "us-east-1"
    assert later[0] is not later[1]  # separate sessions (boto3's are not thread-safe); only the data is shared
