"""A host group's ledger entries (cluster layout, ``P:fx:{<s>|<g>}``) read
and written in one place: the two encodings of their effects read alike, a
value that is no entry is said to be none, and a migration from layout 6
rewrites an entry of a host's ledger for its group's, and nothing else."""

from __future__ import annotations

import json

import pytest

from incremental_crawler.state.stores.redis.layout import _entry_of_host
from incremental_crawler.state.stores.redis.ledger_entry import (
    DamagedEffects,
    LedgerEntry,
    damaged_entry,
    entry_of,
    read_entry,
)

EFFECTS = {"sums": {"1000|parse": [1, 120]}, "hosts": ["a.example"], "splits": 0}


@pytest.mark.parametrize("raw", [
    # As cluster_host.lua and cluster_forget.lua write it (cjson: the
    # effects a string of JSON, the time an integer).
    json.dumps([1_700_000_000, json.dumps(EFFECTS)]).encode(),
    # As a migration writes it (the effects the object).
    entry_of(1_700_000_000, EFFECTS),
], ids=["scripts", "migration"])
def test_an_entry_reads_the_same_whichever_wrote_it(raw):
    entry = read_entry(raw)
    assert entry == LedgerEntry(1_700_000_000, EFFECTS)
    assert type(entry.stamped) is int


@pytest.mark.parametrize("raw", [
    b"not json", b"[]", b"[1700000000]", b'"ab"', b"7",
    json.dumps(["yesterday", EFFECTS]).encode(),
    json.dumps([None, EFFECTS]).encode(),
], ids=["not-json", "empty", "one", "string", "number", "time-a-word", "time-null"])
def test_a_value_that_is_no_entry_reads_as_none(raw):
    assert read_entry(raw) is None


@pytest.mark.parametrize("effects", ["{not json", json.dumps([1, 2]), None],
                         ids=["string-not-json", "a-list", "null"])
def test_an_entry_whose_effects_are_damaged_says_so(effects):
    with pytest.raises(ValueError, match=r"not a JSON object|Expecting"):
        read_entry(json.dumps([1_700_000_000, effects]))


#: Effects whose member is not of its kind (by hand: the scripts do not
#: write these), and the member the error names. Each reached the readers
#: unseen before: a bare OverflowError (inf) or TypeError (a number among
#: strings) raised where the effects were merged or sent.
DAMAGED_MEMBERS = [
    ('{"latest": 1e400}', "latest", "a time"),
    ('{"splits": 1e999}', "splits", "a whole number"),
    (json.dumps({"hosts": ["a.example", 1]}), "hosts", "a list of host names"),
    (json.dumps({"checks": [[1, 2], ["x", 3]]}), "checks", "a list of [page, time or '']"),
    (json.dumps({"sums": 5}), "sums", "an object of"),
    (json.dumps({"sums": {"1000|parse": [1, "many"]}}), "sums", "an object of"),
    (json.dumps({"due": {"a.example|0": None}}), "due", "an object of bucket: next visit"),
]
DAMAGED_IDS = ["latest-inf", "splits-inf", "hosts-a-number", "checks-a-number", "sums-a-number",
               "sums-a-word", "due-null"]


@pytest.mark.parametrize(("effects", "member", "kind"), DAMAGED_MEMBERS, ids=DAMAGED_IDS)
def test_an_entry_whose_member_is_damaged_names_the_member(effects, member, kind):
    with pytest.raises(DamagedEffects) as failed:
        read_entry(json.dumps([1_700_000_000, effects]))
    said = damaged_entry("P:fx:{books|7}", "abc123", failed.value)
    assert f"(token abc123): its effects' {member} are not {kind}" in said, said


def test_an_entry_as_the_scripts_write_it_passes_the_check():
    # cjson writes an empty table as {}, a missing check time as '', and
    # numbers read from Redis as strings of digits.
    effects = {"sums": {"1000|parse": [1, 120]}, "checks": [["p1", ""], ["p2", "1700000000"]],
               "due": {"a.example|0": "1000"}, "splits": 0, "hosts": {}, "latest": "",
               "counts": {"a.example": [1, 3]}}
    raw = json.dumps([1_700_000_000, json.dumps(effects)])
    assert read_entry(raw) == LedgerEntry(1_700_000_000, effects)


@pytest.mark.parametrize(("effects", "why"), [
    (json.dumps([1, 2]), "its effects are not a JSON object: '[1, 2]'"),
    ("{not json", "its effects are not JSON (Expecting"),
], ids=["a-list", "string-not-json"])
def test_what_a_damaged_entry_stops_on_names_it_and_the_way_out(effects, why):
    with pytest.raises(DamagedEffects) as failed:
        read_entry(json.dumps([1_700_000_000, effects]))
    said = damaged_entry("P:fx:{books|7}", "abc123", failed.value)
    assert said.startswith(f"the ledger P:fx:{{books|7}} holds a damaged entry (token abc123): "
                           f"{why}"), said
    # The command quoted for a shell (a '|' in the key would pipe).
    assert """redis-cli -c HSET 'P:fx:{books|7}' abc123 '[0,"{}"]'""" in said, said
    assert "scrapy state reset" in said


def test_an_entry_whose_members_are_damaged_is_named_by_what_was_raised():
    said = damaged_entry("P:fx:{books|7}", "abc123", TypeError("'int' object is not iterable"))
    assert said.startswith("the ledger P:fx:{books|7} holds a damaged entry (token abc123): "
                           "its effects cannot be read (TypeError(\"'int' object is not "
                           "iterable\"))"), said


def test_a_host_ledgers_entry_names_its_host_in_its_groups_ledger():
    old = dict(EFFECTS, hosts=[], new_host=True)
    raw = json.dumps([1_700_000_000, json.dumps(old)]).encode()
    moved = read_entry(_entry_of_host(raw, "b.example"))
    assert moved is not None
    assert moved.stamped == 1_700_000_000
    assert moved.effects == dict(EFFECTS, hosts=["b.example"])


@pytest.mark.parametrize("raw", [
    b"not json", json.dumps(["yesterday", {"new_host": True}]).encode(),
    json.dumps([1_700_000_000, "{not json"]).encode(),
], ids=["not-json", "time-a-word", "effects-damaged"])
def test_a_migration_keeps_a_value_that_is_no_entry_as_it_is(raw):
    assert _entry_of_host(raw, "b.example") == raw
