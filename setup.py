"""Packaging: `pip install -e .` and the egg that scrapyd-deploy uploads."""

from setuptools import find_packages, setup

setup(
    name="incremental_crawler",
    version="0.1.0",
    description="Incremental re-crawls for Scrapy: conditional requests, "
    "content fingerprints, state committed only with its data",
    packages=find_packages(include=["incremental_crawler", "incremental_crawler.*"]),
    package_data={"incremental_crawler": ["py.typed", "politeness/budget.lua"]},
    # 3.11: the package uses enum.StrEnum, datetime.UTC and typing.Self; CI
    # runs on 3.11.
    python_requires=">=3.11",
    install_requires=[
        "Scrapy>=2.19,<2.20",
        "itemadapter>=0.13",
        "w3lib>=2.5",
        "scrapy-redis>=0.9.1",
        # Live metrics (opt-in, INCREMENTAL_METRICS_PORT); imported only then.
        "prometheus_client>=0.20",
        # The HTML report embeds the Plotly.js it ships (never imported).
        "plotly>=6",
    ],
    entry_points={
        # scrapyd finds the project's settings through this entry point.
        "scrapy": ["settings = incremental_crawler.settings"],
        # Scrapy adds these commands to every project in the environment:
        # installing the package is enough (no COMMANDS_MODULE). The ones
        # that replace Scrapy's are Scrapy's own wherever the add-on is not
        # enabled (incremental_crawler.addon.addon_enabled).
        "scrapy.commands": [
            f"{name} = incremental_crawler.commands.{name}:Command"
            for name in ("demo", "items", "state", "report",
                         "crawl", "shell", "fetch", "view", "parse", "check")
        ],
    },
    zip_safe=False,
)
