"""`keyshift data`: fetch, verify and locate the real inputs."""

from __future__ import annotations

import click

from keyshift.data.flights import FLIGHTS_3M, fetch_flights, flights_path
from keyshift.settings import Settings

DATASETS = ("flights",)


@click.group(name="data")
def command() -> None:
    """Fetch, verify and locate real input data sets (cached under the state dir)."""


@command.command()
@click.argument("dataset", type=click.Choice(DATASETS))
@click.option("--force", is_flag=True, help="Download again even if a verified copy is cached.")
def fetch(dataset: str, force: bool) -> None:
    """Download DATASET, verify its checksums and cache it; reuse a verified cached copy.

    flights: 3,000,000 US flights (Jan-Jun 2001) from the npm package vega-datasets@3.2.1,
    fetched with `npm pack`; tarball and file SHA-256, row count and columns are checked.
    """
    path = fetch_flights(Settings(), force=force)
    click.echo(f"{dataset}: {path} ({FLIGHTS_3M.rows:,} rows, SHA-256 {FLIGHTS_3M.sha256[:16]}... verified)")


@command.command()
@click.argument("dataset", type=click.Choice(DATASETS))
def path(dataset: str) -> None:
    """Print the path of the verified cached DATASET (fails if it was never fetched)."""
    click.echo(str(flights_path(Settings())))
