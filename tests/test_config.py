"""IncrementalConfig: defaults and rejected values."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from scrapy.settings import Settings

from incremental_crawler.config import DEFAULT_SETTINGS, IncrementalConfig, SettingError
from incremental_crawler.spiders.sitemap import SitemapPagesSpider


def test_defaults() -> None:
    config = IncrementalConfig.from_settings(Settings())
    assert config.enabled is True
    assert config.state_uri is None
    assert config.max_age == 30 * 24 * 3600
    assert config.batch_size == 500
    assert isinstance(config.batch_size, int)
    assert config.flush_interval == 1.0
    assert config.volatile_fields == frozenset({"crawled_at", "scraped_at", "fetched_at"})
    assert config.fingerprint_field == "fingerprint"
    assert config.item_key_field == "url"
    assert config.store_items is True
    assert config.report is True


def test_defaults_match_default_settings() -> None:
    config = IncrementalConfig.from_settings(Settings())
    assert config.enabled is DEFAULT_SETTINGS["INCREMENTAL_ENABLED"]
    assert config.state_uri == DEFAULT_SETTINGS["INCREMENTAL_STATE_URI"]
    assert config.max_age == DEFAULT_SETTINGS["INCREMENTAL_MAX_AGE"]
    assert config.batch_size == DEFAULT_SETTINGS["INCREMENTAL_BATCH_SIZE"]
    assert config.flush_interval == DEFAULT_SETTINGS["INCREMENTAL_FLUSH_INTERVAL"]
    assert config.volatile_fields == frozenset(DEFAULT_SETTINGS["INCREMENTAL_VOLATILE_FIELDS"])
    assert config.fingerprint_field == DEFAULT_SETTINGS["INCREMENTAL_FINGERPRINT_FIELD"]
    assert config.item_key_field == DEFAULT_SETTINGS["INCREMENTAL_ITEM_KEY_FIELD"]
    assert config.store_items is DEFAULT_SETTINGS["INCREMENTAL_STORE_ITEMS"]
    assert config.report is DEFAULT_SETTINGS["INCREMENTAL_REPORT"]


def test_installed_defaults_read_the_same() -> None:
    # What the add-on does: the defaults installed as settings.
    settings = Settings()
    settings.setdict(DEFAULT_SETTINGS, priority="addon")
    assert IncrementalConfig.from_settings(settings) == IncrementalConfig.from_settings(Settings())


def test_values_from_the_command_line_are_strings() -> None:
    config = IncrementalConfig.from_settings(
        Settings(
            {
                "INCREMENTAL_ENABLED": "False",
                "INCREMENTAL_STATE_URI": "sqlite:///state.db",
                "INCREMENTAL_MAX_AGE": "0",
                "INCREMENTAL_BATCH_SIZE": "10",
                "INCREMENTAL_FLUSH_INTERVAL": "0.5",
                "INCREMENTAL_VOLATILE_FIELDS": "seen_at,price_checked",
                "INCREMENTAL_STORE_ITEMS": "0",
                "INCREMENTAL_REPORT": "false",
            }
        )
    )
    assert config.enabled is False
    assert config.state_uri == "sqlite:///state.db"
    assert config.max_age == 0
    assert config.batch_size == 10
    assert config.flush_interval == 0.5
    assert config.volatile_fields == frozenset({"seen_at", "price_checked"})
    assert config.store_items is False
    assert config.report is False


def test_empty_state_uri_means_default() -> None:
    config = IncrementalConfig.from_settings(Settings({"INCREMENTAL_STATE_URI": ""}))
    assert config.state_uri is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("INCREMENTAL_BATCH_SIZE", 0),
        ("INCREMENTAL_BATCH_SIZE", "0"),
        ("INCREMENTAL_BATCH_SIZE", -5),
        ("INCREMENTAL_BATCH_SIZE", "abc"),
        ("INCREMENTAL_BATCH_SIZE", "1.5"),
        ("INCREMENTAL_BATCH_SIZE", []),
        ("INCREMENTAL_MAX_AGE", "abc"),
        ("INCREMENTAL_MAX_AGE", -1),
        ("INCREMENTAL_MAX_AGE", "-1"),
        ("INCREMENTAL_MAX_AGE", ""),
        ("INCREMENTAL_FLUSH_INTERVAL", 0),
        ("INCREMENTAL_FLUSH_INTERVAL", "soon"),
        ("INCREMENTAL_FLUSH_INTERVAL", -1.0),
    ],
)
def test_bad_values_raise_an_error_naming_the_setting(name: str, value: Any) -> None:
    with pytest.raises(SettingError) as info:
        IncrementalConfig.from_settings(Settings({name: value}))
    message = str(info.value)
    assert name in message
    assert repr(value) in message


def test_config_is_frozen() -> None:
    config = IncrementalConfig.from_settings(Settings())
    with pytest.raises(AttributeError):
        config.batch_size = 1  # type: ignore[misc]


BAD_SETTINGS = {
    "a number that is not one": ({"INCREMENTAL_BATCH_SIZE": "abc"}, "INCREMENTAL_BATCH_SIZE"),
    "a throttle start rate above its maximum": (
        {"INCREMENTAL_THROTTLE_ENABLED": True, "INCREMENTAL_THROTTLE_START_RATE": 100,
         "INCREMENTAL_THROTTLE_MAX_RATE": 10},
        "INCREMENTAL_THROTTLE_START_RATE"),
    "an unknown key in a per-domain override": (
        {"INCREMENTAL_THROTTLE_ENABLED": True,
         "INCREMENTAL_THROTTLE_DOMAINS": {"127.0.0.1": {"start": 2}}},
        "INCREMENTAL_THROTTLE_DOMAINS"),
}


@pytest.mark.parametrize(("settings", "named"), list(BAD_SETTINGS.values()),
                         ids=list(BAD_SETTINGS))
@pytest_twisted.ensureDeferred
async def test_a_bad_setting_stops_the_crawl_before_its_first_request(
    site, crawl, settings, named
):
    # NotConfigured would only disable the component: the crawl would run
    # without state kept, or without politeness, and say so in one warning.
    site.add_page("/a", "strong")
    with pytest.raises(SettingError, match=named):
        await crawl(SitemapPagesSpider, settings=settings, sitemap_url=site.url("/sitemap.xml"))
    assert site.log == []


@pytest_twisted.ensureDeferred
async def test_a_misspelt_setting_is_named_in_a_warning_with_the_one_it_meant(
    site, crawl, caplog
):
    # Scrapy takes any setting name: without the warning, a misspelt one
    # leaves the default in force and the crawl says nothing of it.
    site.add_page("/a", "strong")
    with caplog.at_level("WARNING"):
        crawler = await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"),
                              settings={"INCREMENTAL_REPORT_ENABLED": False,
                                        "INCREMENTAL_NO_SUCH_THING": 1,
                                        "INCREMENTAL_BATCH_SIZE": 7})
    warned = sorted(r.getMessage() for r in caplog.records if "does nothing" in r.getMessage())
    assert warned == [
        ("Setting INCREMENTAL_NO_SUCH_THING is not an incremental_crawler setting and does "
         "nothing"),
        ("Setting INCREMENTAL_REPORT_ENABLED is not an incremental_crawler setting and does "
         "nothing (did you mean INCREMENTAL_REPORT?)"),
    ]
    assert crawler.stats.get_value("incremental/unknown_settings") == 2
    assert [r.path for r in site.log if r.path == "/a"] == ["/a"]
