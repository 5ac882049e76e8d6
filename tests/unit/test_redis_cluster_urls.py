"""The Redis Cluster URL form, ``redis+cluster://`` (pure: nothing is connected)."""

from __future__ import annotations

import pytest

from incremental_crawler.redis_cluster import _seeds, is_cluster_url
from incremental_crawler.uris import redacted


def test_seed_nodes_and_their_options_are_read_from_the_url():
    nodes, options = _seeds("redis+cluster://user:pw@10.0.0.1:7000,10.0.0.2,[::1]:7002/0"
                            "?socket_timeout=3")
    assert nodes == [("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002)]
    assert options["username"] == "user" and options["password"] == "pw"
    assert options["socket_timeout"] == 3.0
    assert "db" not in options and "host" not in options and "ssl" not in options
    nodes, options = _seeds("rediss+cluster://h:7000")
    assert nodes == [("h", 7000)] and options["ssl"] is True


@pytest.mark.parametrize(("url", "why"), [
    ("redis+cluster://h:7000/3", "only database 0, not '3'"),
    ("redis+cluster:///", "no seed node"),
    ("redis+cluster://h:port/", "seed node 'h:port'"),
])
def test_a_url_that_cannot_name_a_cluster_is_refused_saying_why(url, why):
    with pytest.raises(ValueError, match=why):
        _seeds(url)


def test_the_form_names_a_cluster_and_its_password_never_shows():
    assert is_cluster_url("redis+cluster://h:1/") and is_cluster_url("REDISS+CLUSTER://h:1/")
    assert not is_cluster_url("redis://h:1/0") and not is_cluster_url("unix:///r.sock")
    assert redacted("redis+cluster://:secret@h1:1,h2:2/") == "redis+cluster://:***@h1:1,h2:2/"
