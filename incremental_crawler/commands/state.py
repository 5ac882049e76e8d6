"""``scrapy state``: inspect and repair the state store.

- ``scrapy state [--spider NAME] [--hosts] [--rates]``: one summary block
  per scope (pages, the last crawl's figures, its remembered politeness
  rates, who holds it now), and a table per host, or of those rates;
- ``scrapy state url URL [--spider NAME] [--json]``: everything stored
  about one URL;
- ``scrapy state forget URL --spider NAME``, ``forget-host HOST --spider
  NAME``, ``reset --spider NAME --yes``: repairs, refused while a crawl
  or a cluster worker holds the scope (its hold lapses by itself if it was
  killed); a repair holds the scope alone while it runs, so that no crawl
  or worker starts meanwhile;
- ``scrapy state copy --to URI (--spider NAME | --all) --yes``: copy a
  scope's whole state into another store (see
  :mod:`incremental_crawler.state.scope_copy`).

``--spider NAME`` names the spider's scope (its ``incremental_scope``, else
its name); a name that is no spider of the project is taken as a scope. The
command never creates a store: a missing one is an error, as for
``scrapy items``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.spiderloader import get_spider_loader

from incremental_crawler import clock
from incremental_crawler.commands._in_project import InProject
from incremental_crawler.commands._repair_hold import HoldLost, RepairHold, ScopeTaken
from incremental_crawler.config import setting_or_default
from incremental_crawler.formats import duration, shares, size
from incremental_crawler.politeness.remembered import not_used
from incremental_crawler.recipes import load_links, read_record
from incremental_crawler.state.keys import canonical_url
from incremental_crawler.state.records import PageFlags
from incremental_crawler.state.scope_copy import copy_plan, copy_scope, refuse_destination
from incremental_crawler.state.stores import (
    AdminStore,
    StateStoreError,
    open_admin_store,
    state_uri,
    store_class,
)
from incremental_crawler.state.stores.base import RepairStopped, dead_pid, describe_holder
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator

    from scrapy.settings import BaseSettings

    from incremental_crawler.state.records import CrawlRecord, HostTrust, PageState
    from incremental_crawler.state.scope_copy import CopyCounts
    from incremental_crawler.state.stores.base import HostSummary, SlotRates, UrlRecord

__all__ = ["Command"]

#: Exit statuses: a refusal or a failure, and a usage error (as Scrapy's own).
FAILED, USAGE = 1, 2
#: Width of the label column of the summary blocks.
_LABEL = 14
ACTIONS = ("url", "forget", "forget-host", "reset", "copy")


class Refused(Exception):
    """The command does not do what was asked; the message says why."""

    def __init__(self, message: str, status: int = FAILED) -> None:
        super().__init__(message)
        self.status = status


# -- formats for people ----------------------------------------------------------


def when(timestamp: float | None) -> str:
    """POSIX time → ``"2024-05-01 12:00:03 UTC"``; ``"never"`` for none."""
    if not timestamp:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


def share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _line(label: str, text: str, indent: int = 2) -> str:
    return f"{' ' * indent}{label:<{_LABEL}}{text}"


def _flags(flags: int) -> str:
    names = [flag.name for flag in PageFlags if flags & flag and flag.name]
    return "|".join(names) or "none"


# -- the command -------------------------------------------------------------------


class Command(InProject, ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return ("[--spider NAME] [--hosts] [--rates] | url URL [--spider NAME] [--json] | "
                "forget URL --spider NAME | forget-host HOST --spider NAME | "
                "reset --spider NAME --yes | copy --to URI (--spider NAME | --all) --yes")

    def short_desc(self) -> str:
        return "Inspect the incremental state store, or repair one scope of it"

    def long_desc(self) -> str:
        return (
            "Without an action: a summary of every scope (or of --spider's), with the "
            "last crawl's figures; --hosts adds a table per host, --rates a table of the "
            "remembered politeness rates. 'url URL' shows what "
            "is stored about one URL. 'forget URL', 'forget-host HOST' and 'reset' "
            "delete state of one scope (--spider) so that the next crawl finds it new; "
            "they refuse while a crawl holds the scope (and crawls refuse to start while "
            "they run), and reset needs --yes. "
            "'copy --to URI' copies a scope (--spider, or --all of them) into another "
            "store, to crawl on there as if it had always been there; without --yes it "
            "says what it would copy."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--spider", metavar="NAME", default=None,
                            help="the spider (its incremental_scope), or a scope by name")
        parser.add_argument("--hosts", action="store_true",
                            help="a table of the scope's hosts (pages, due, gone, trust)")
        parser.add_argument("--rates", action="store_true",
                            help="a table of the scope's remembered politeness rates, per slot")
        parser.add_argument("--json", action="store_true",
                            help="with url, the record as JSON, for machines")
        parser.add_argument("--yes", action="store_true",
                            help="with reset, really delete everything of the scope; "
                                 "with copy, really copy")
        parser.add_argument("--to", metavar="URI", default=None,
                            help="with copy, the destination store (as INCREMENTAL_STATE_URI)")
        parser.add_argument("--all", action="store_true",
                            help="with copy, every scope of the store")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        action, target = self._parse(args, opts)
        try:
            store = open_admin_store(self.settings, "state")
        except StateStoreError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = FAILED
            return
        if action == "copy":
            # It closes the store itself, on the event loop its reads ran on.
            self.exitcode = run_copy(store, self.settings, opts)
            return
        try:
            scope = None if opts.spider is None else resolve_scope(self.settings, opts.spider)
            out = self._run(store, action, target, scope, opts)
            sys.stdout.write("\n".join(out) + "\n")
        except Refused as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = exc.status
        except StateStoreError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = FAILED
        finally:
            asyncio.run(store.close())

    @staticmethod
    def _parse(args: list[str], opts: argparse.Namespace) -> tuple[str | None, str | None]:
        if not args:
            return None, None
        action, rest = args[0], args[1:]
        if action not in ACTIONS:
            raise UsageError(f"unknown action {action!r} (one of: {', '.join(ACTIONS)})")
        wants = 0 if action in ("reset", "copy") else 1
        if len(rest) != wants:
            raise UsageError(f"scrapy state {action} takes "
                             f"{'no argument' if not wants else 'one argument'}")
        if action == "copy":
            copy_usage(opts)
            return action, None
        if action != "url" and opts.spider is None:
            raise UsageError(f"scrapy state {action} needs --spider NAME (the scope to repair)")
        return action, rest[0] if rest else None

    def _run(self, store: AdminStore, action: str | None, target: str | None,
             scope: str | None, opts: argparse.Namespace) -> list[str]:
        if action is None:
            assert self.settings is not None
            remember_for = float(setting_or_default(self.settings,
                                                    "INCREMENTAL_THROTTLE_REMEMBER_FOR"))
            return summary(store, scope, hosts=opts.hosts, rates=opts.rates,
                           remember_for=remember_for)
        if action == "url":
            assert target is not None
            return url_lines(store, canonical_url(target), scope, as_json=opts.json)
        assert scope is not None
        if action == "reset" and not opts.yes:
            counts = store.count_scope(scope)
            raise Refused(f"reset would delete everything of scope {scope!r} in "
                          f"{store.location}: {counts.describe()}; add --yes to do it", USAGE)
        assert self.settings is not None
        settings = self.settings
        try:
            with RepairHold(lambda: open_admin_store(settings, "state"), scope) as hold:
                store.repair_guard = hold.check
                try:
                    return self._repair(store, action, target, scope)
                finally:
                    store.repair_guard = None
        except ScopeTaken as exc:
            raise Refused(held_message(store, scope, exc)) from None
        except RepairStopped as exc:
            deleted = (f"; deleted before it stopped: {exc.removed.describe()}"
                       if any(exc.removed) else "")
            raise Refused(f"the repair of scope {scope!r} stopped, nothing further deleted: "
                          f"{exc}{deleted}; check the scope (scrapy state) and run the repair "
                          "again once no crawl holds it") from None
        except HoldLost as exc:
            raise Refused(f"the repair of scope {scope!r} ran, but {exc}: check the scope "
                          "(scrapy state) and run the repair again once no crawl holds "
                          "it") from None

    @staticmethod
    def _repair(store: AdminStore, action: str, target: str | None, scope: str) -> list[str]:
        """The repair *action*, run while it holds *scope* alone."""
        if action == "forget":
            assert target is not None
            url = canonical_url(target)
            removed = store.forget_page(scope, url)
            if not any(removed):
                raise Refused(f"scope {scope!r} has nothing stored for {url}")
            return [f"forgot {url} in scope {scope!r}: {removed.describe()}"]
        if action == "forget-host":
            assert target is not None
            host = target.lower()
            removed = store.forget_host(scope, host)
            if not any(removed):
                raise Refused(f"scope {scope!r} has nothing stored for host {host}")
            return [f"forgot host {host} in scope {scope!r}: {removed.describe()}"]
        removed = store.reset_scope(scope)
        return [f"reset scope {scope!r}: deleted {removed.describe()}"]


# -- copy ---------------------------------------------------------------------------


def copy_usage(opts: argparse.Namespace) -> None:
    if not opts.to:
        raise UsageError("scrapy state copy needs --to URI (the destination store)")
    if (opts.spider is None) == (not opts.all):
        raise UsageError("scrapy state copy needs one of --spider NAME (one scope) and --all")


def run_copy(source: AdminStore, settings: BaseSettings, opts: argparse.Namespace) -> int:
    """``scrapy state copy``: the exit status. Everything runs on one event
    loop (the stores' clients are bound to it), the source closed on it too."""
    async def main() -> int:
        try:
            scope = None if opts.spider is None else resolve_scope(settings, opts.spider)
            return await copy_scopes(source, settings, scope, opts)
        finally:
            await source.close()

    try:
        return asyncio.run(main())
    except (Refused, StateStoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status if isinstance(exc, Refused) else FAILED


async def copy_scopes(source: AdminStore, settings: BaseSettings, scope: str | None,
                      opts: argparse.Namespace) -> int:
    dest_uri: str = opts.to
    if redacted(dest_uri) == redacted(state_uri(settings)):
        raise Refused(f"--to {redacted(dest_uri)} is the store the copy reads from")
    scopes = source.scopes() if scope is None else [scope]
    if not scopes:
        raise Refused(f"{source.location} holds no scope to copy")
    for name in scopes:
        refuse_if_held(source, name)
    with _said_of_to(dest_uri):
        dest_cls = store_class(dest_uri, settings, named_by="--to")
    if not issubclass(dest_cls, AdminStore):
        raise Refused(f"--to {redacted(dest_uri)}: its store class "
                      f"{dest_cls.__module__}.{dest_cls.__qualname__} has the crawl interface "
                      "only; a copy needs AdminStore there (to refuse a scope it holds, "
                      "and to verify what it wrote)")
    with _said_of_to(dest_uri):
        exists = dest_cls.exists(dest_uri, settings=settings)
    if not opts.yes and not exists:
        plans = [(name, await copy_plan(source, name)) for name in scopes]
        where = f"a new store {dest_cls.where(dest_uri)}"
        raise Refused(_plan_text(plans, source, where), USAGE)
    with _said_of_to(dest_uri):
        destination = dest_cls.from_uri(dest_uri, settings=settings)
    assert isinstance(destination, AdminStore)
    try:
        if destination.store_identity() == source.store_identity():
            raise Refused(f"--to {redacted(dest_uri)} is the store the copy reads from "
                          f"({source.location})")
        for name in scopes:
            await refuse_destination(destination, name, dest_uri)
        if not opts.yes:
            plans = [(name, await copy_plan(source, name)) for name in scopes]
            raise Refused(_plan_text(plans, source, destination.location), USAGE)
        for name in scopes:
            print(f"copying scope {name!r} from {source.location} to {destination.location}",
                  flush=True)
            copied = await copy_scope(source, destination, name, dest_uri,
                                      say=lambda line: print(f"  {line}", flush=True))
            print(f"copied scope {name!r}; verified: {copied.describe()} on both sides",
                  flush=True)
    finally:
        await destination.close()
    return 0


@contextmanager
def _said_of_to(dest_uri: str) -> Iterator[None]:
    """A failure to open the store ``--to`` names, said of ``--to``, and
    without the URI's secrets (a store of one's own may quote it whole)."""
    try:
        yield
    except StateStoreError as exc:
        message = str(exc).replace(dest_uri, redacted(dest_uri))
        raise StateStoreError(message if message.startswith("--to ")
                              else f"--to: {message}") from exc


def _plan_text(plans: list[tuple[str, CopyCounts]], source: AdminStore, where: str) -> str:
    what = "; ".join(f"scope {name!r}: {plan.describe()}" for name, plan in plans)
    return (f"copy would copy from {source.location} to {where}: {what}; "
            "add --yes to do it")


# -- opening ----------------------------------------------------------------------


def resolve_scope(settings: BaseSettings, name: str) -> str:
    """The scope of the project's spider *name* (``incremental_scope``, else
    its name); a name that is no spider of the project is a scope itself."""
    try:
        spidercls = get_spider_loader(settings).load(name)
    except KeyError:
        return name
    return getattr(spidercls, "incremental_scope", None) or name


def refuse_if_held(store: AdminStore, scope: str) -> None:
    """A copy reads a scope while nothing holds it (a check, not a hold)."""
    holders = store.scope_holders(scope, clock.now())
    if holders:
        raise Refused(held_text(scope, holders))


def held_message(store: AdminStore, scope: str, taken: ScopeTaken) -> str:
    """Why a repair of *scope* is refused: every holder of it now (the one
    that refused it if the others are gone meanwhile)."""
    return held_text(scope, store.scope_holders(scope, clock.now())
                     or {taken.holder: taken.expires})


def held_text(scope: str, holders: dict[str, float]) -> str:
    who = ", ".join(hold(holder, expires) for holder, expires in sorted(holders.items()))
    return (f"scope {scope!r} is held by {who}; "
            "try again when it has finished or its hold has lapsed")


def hold(holder: str, expires: float) -> str:
    """A crawl holding a scope, ``crawl host:pid`` (``cluster worker
    host:pid:id``, ``repair host:pid``).

    A hold only says the crawl did not release it: it may have been killed
    (its hold then lapses by itself). A holder on this host whose pid is not
    running was killed, and is named so.
    """
    lapses = f"its hold lapses at {when(expires)}"
    pid = dead_pid(holder)
    if pid is not None:
        return (f"{describe_holder(holder)} (pid {pid} is not running on this host: it was "
                f"killed; {lapses})")
    return f"{describe_holder(holder)} (running, or killed: {lapses})"


# -- summaries ----------------------------------------------------------------------


def summary(store: AdminStore, scope: str | None, *, hosts: bool, rates: bool = False,
            remember_for: float = 0.0) -> list[str]:
    scopes = store.scopes() if scope is None else [scope]
    if scope is not None and scope not in store.scopes():
        raise Refused(f"scope {scope!r} has nothing stored in {store.location}")
    if not scopes:
        return [f"{store.location}: empty (no crawl stored anything yet)"]
    now = clock.now()
    out = [f"state store {store.location}"]
    for name in scopes:
        summaries = store.summarize_hosts(name, now)
        remembered = store.read_slot_rates(name)
        out.append("")
        out.extend(scope_block(store, name, summaries, now,
                               rates_line(remembered, now, remember_for)))
        if hosts:
            out.append("")
            out.extend(host_table(summaries))
        if rates and (remembered.rates or remembered.unreadable):
            out.append("")
            out.extend(rate_table(remembered, now, remember_for))
    return out


def scope_block(store: AdminStore, scope: str, hosts: list[HostSummary],
                now: float, politeness: str) -> list[str]:
    pages = sum(h.pages for h in hosts)
    out = [f"scope {scope}",
           _line("pages", f"{pages} (due now {sum(h.due for h in hosts)}, "
                          f"gone {sum(h.gone for h in hosts)}, "
                          f"failing {sum(h.failing for h in hosts)}), "
                          f"{size(sum(h.size for h in hosts))} stored"),
           _line("hosts", str(sum(1 for h in hosts if h.pages)))]
    records = store.crawls(scope, store.crawl_history)
    out.extend(last_crawl(records))
    out.append(_line("crawls kept", f"{len(records)} (at most {store.crawl_history})"))
    out.append(_line("politeness", politeness))
    holders = store.scope_holders(scope, now)
    for holder, expires in sorted(holders.items()):
        out.append(_line("held by", hold(holder, expires)))
    return out


def last_crawl(records: list[CrawlRecord]) -> list[str]:
    """The newest crawl's lines; a cluster run's workers summed."""
    if not records:
        return [_line("last crawl", "none recorded")]
    run = [r for r in records if r.started == records[0].started]
    figures: dict[str, float] = {}
    for record in run:
        for name, value in record.figures.items():
            figures[name] = figures.get(name, 0) + value
    f = figures.get
    reasons = ", ".join(sorted({r.reason for r in run if r.reason}))
    workers = f", {len(run)} workers" if len(run) > 1 else ""
    requests, not_modified = f("requests", 0), f("not_modified", 0)
    received, saved = f("bytes_received", 0), f("bytes_saved", 0)
    skipped = f("bytes_skipped", 0)
    return [
        _line("last crawl", f"{when(records[0].started)}, ran "
                            f"{duration(max(r.figures.get('duration', 0) for r in run))}"
                            f" ({reasons or 'unknown end'}{workers})"),
        _line("requests", f"{requests:.0f}, of which 304 not modified "
                          f"{not_modified:.0f} ({share(not_modified, requests)})", 4),
        _line("items", f"{f('new', 0):.0f} new, {f('changed', 0):.0f} changed, "
                       f"{f('deleted', 0):.0f} deleted, {f('unchanged', 0):.0f} unchanged", 4),
        _line("bytes", f"{size(received)} received, ~{size(saved)} saved by 304s"
                       f"{_not_requested(skipped)}{_shares(received, saved + skipped)}", 4),
    ]


def _not_requested(skipped: float) -> str:
    return f" and ~{size(skipped)} by pages not requested" if skipped else ""


def _shares(received: float, saved: float) -> str:
    # The end-of-crawl report's phrase, for the run (its workers summed).
    phrase = shares(received, saved)
    return f" ({phrase})" if phrase else ""


def rates_line(remembered: SlotRates, now: float, remember_for: float) -> str:
    """The scope's remembered politeness rates, counted: how many the next
    crawl would start from, and why the others not."""
    found = len(remembered.rates) + len(remembered.unreadable)
    if not found:
        return "no rate remembered"
    reasons: dict[str, int] = {}
    for record in remembered.rates:
        why = not_used(record, now, remember_for)
        if why is not None:
            reasons[why] = reasons.get(why, 0) + 1
    if remembered.unreadable:
        reasons["unreadable"] = len(remembered.unreadable)
    text = f"rates of {found} slot{'' if found == 1 else 's'} remembered"
    if reasons:
        text += " (not used: " + ", ".join(f"{n} {why}" for why, n in reasons.items()) + ")"
    return text


def rate_table(remembered: SlotRates, now: float, remember_for: float) -> list[str]:
    """Per slot: the rate a crawl's window last reached there, whether hard
    signals had cut it, how it ended, and how long ago it was saved (and
    why the next crawl would not use it)."""
    head = ("slot", "rate", "after hard signals", "ended", "saved")
    rows = []
    for record in remembered.rates:
        age = now - record.saved_at
        saved = f"{duration(age)} ago" if age >= 0 else when(record.saved_at)
        why = not_used(record, now, remember_for)
        if why is not None:
            saved += f" (not used: {why})"
        rows.append((record.slot, f"{record.rate:.3g}/s", "no" if record.slow_start else "yes",
                     record.ended or "healthy", saved))
    rows += [(slot, "-", "-", "-", "unreadable (damaged): not used")
             for slot in remembered.unreadable]
    rows.sort(key=lambda row: row[0])
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]

    def fmt(row: tuple[str, ...]) -> str:
        # The rate right, as counts are.
        cells = [cell.rjust(w) if i == 1 else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        return "  " + "  ".join(cells).rstrip()

    return [fmt(head), *(fmt(row) for row in rows)]


def _lastmod_trust(trust: HostTrust | None, now: float) -> str:
    if trust is None:
        return "-"
    text = f"{trust.checks} checks, {trust.lies} lies, {trust.stale_lastmods} stale"
    if trust.distrusted_until > now:
        text += f"; distrusted until {when(trust.distrusted_until)}"
    return text


def _validator_trust(trust: HostTrust | None, now: float) -> str:
    if trust is None:
        return "-"
    parts = []
    if trust.validators_distrusted_until > now:
        parts.append(f"distrusted until {when(trust.validators_distrusted_until)}")
    if trust.validators_unstable_since:
        parts.append(f"unstable since {when(trust.validators_unstable_since)}")
    return "; ".join(parts) or "trusted"


def host_table(hosts: list[HostSummary]) -> list[str]:
    now = clock.now()
    head = ("host", "pages", "due", "gone", "failing", "stored", "lastmod trust", "validators")
    rows = [(h.host or "(none)", str(h.pages), str(h.due), str(h.gone), str(h.failing),
             size(h.size), _lastmod_trust(h.trust, now), _validator_trust(h.trust, now))
            for h in hosts]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    # Text columns left, counts right.
    left = {0, 6, 7}

    def fmt(row: tuple[str, ...]) -> str:
        cells = [cell.ljust(w) if i in left else cell.rjust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        return "  " + "  ".join(cells).rstrip()

    return [fmt(head), *(fmt(row) for row in rows)]


# -- one URL --------------------------------------------------------------------------


def url_lines(store: AdminStore, url: str, scope: str | None, *, as_json: bool) -> list[str]:
    scopes = store.scopes() if scope is None else [scope]
    records = [store.url_record(name, url) for name in scopes]
    records = [r for r in records if r.pages or r.items]
    if not records:
        where = f"scope {scope!r}" if scope is not None else "any scope"
        raise Refused(f"nothing stored for {url} in {where} of {store.location}")
    if as_json:
        return [json.dumps([url_json(r) for r in records], ensure_ascii=False, indent=2)]
    out: list[str] = []
    for record in records:
        out.extend(url_text(record))
    return out


def url_json(record: UrlRecord) -> dict[str, Any]:
    def links(data: str) -> Any:
        # The recipes, whatever the record's version; as stored if unreadable.
        recipes = load_links(data)
        return data if recipes is None else recipes

    return {
        "scope": record.scope,
        "url": record.url,
        "pages": [{"variant": p.key.variant,
                   **{k: v for k, v in asdict(p).items() if k != "key"},
                   "flag_names": _flags(p.flags).split("|")} for p in record.pages],
        "links": {variant: links(data) for variant, data in record.links.items()},
        "items": record.items,
        "latest": [v._asdict() for v in record.latest],
    }


def url_text(record: UrlRecord) -> list[str]:
    out = [f"{record.url}  (scope {record.scope})"]
    for page in record.pages:
        out.extend(page_text(page))
        data = record.links.get(page.key.variant)
        if data is not None:
            entries = read_record(data)
            if entries is not None:
                out.append(_line("links", f"{len(entries)} requests recorded, "
                                 f"{size(len(data))} (replayed on a 304)", 4))
            else:
                out.append(_line("links", f"{size(len(data))} recorded (not a record "
                                 "this version reads)", 4))
    if not record.pages:
        out.append(_line("page", "not stored (its items are)"))
    latest = {v.key: v for v in record.latest}
    out.append(_line("items", str(len(record.items)) if record.items else "none"))
    for key in record.items:
        version = latest.get(key)
        if version is None:
            out.append(f"    {key} (fingerprint only)")
            continue
        out.append(f"    {key}: version {version.version} ({version.change}, "
                   f"{when(version.stored_at)}), fingerprint {version.fingerprint[:16]}")
        out.append(f"      {json.dumps(version.data, ensure_ascii=False)[:200]}")
    return out


def page_text(page: PageState) -> list[str]:
    variant = f" variant {page.key.variant!r}" if page.key.variant else ""
    validators = ", ".join(part for part in (
        f"ETag {page.etag}" if page.etag else "",
        f"Last-Modified {page.last_modified}" if page.last_modified else "",
    ) if part) or "none"
    status = page.last_status if page.last_status is not None else "-"
    lines = [
        _line(f"page{variant}", f"status {status}, {page.checks} checks, {page.changes} changes, "
                                f"{page.failures} failures in a row"),
        _line("validators", validators, 4),
        _line("fingerprint", page.fingerprint or "none (never fetched in full)", 4),
        _line("size", size(page.size), 4),
        _line("first seen", when(page.first_seen), 4),
        _line("checked", when(page.last_checked), 4),
        _line("fetched", when(page.last_fetched), 4),
        _line("changed", when(page.last_changed), 4),
        _line("next visit", f"{when(page.next_visit)} (interval {duration(page.interval)})", 4),
        _line("flags", _flags(page.flags), 4),
        _line("callback", page.callback or "none (not re-seeded)", 4),
    ]
    if page.lastmod is not None:
        lines.append(_line("lastmod", when(page.lastmod), 4))
    if page.redirect_to:
        lines.append(_line("redirects to", page.redirect_to, 4))
    return lines
