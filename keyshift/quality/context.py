"""The Great Expectations 1.x file Data Context kept in the repository, opened per run.

`keyshift/quality/gx/` is an ordinary GX file context (open it with
`gx.get_context(context_root_dir=..., runtime_environment={"keyshift_run_dir": ...})`):

```
gx/great_expectations.yml          data source `keyshift` (pandas, one dataframe asset per suite),
                                   stores, Data Docs site `run_site`, analytics and progress bars off
gx/expectations/<suite>.json       the three Expectation Suites (written from keyshift.quality.suites)
gx/validation_definitions/*.json   one Validation Definition per suite (its asset's batch + the suite)
gx/checkpoints/*.json              one Checkpoint per suite (result format, UpdateDataDocsAction)
```

Only configuration lives in the repository. What a validation produces goes to the run's folder:
the yml points the validation results store and the Data Docs site at the config variable
`${keyshift_run_dir}` (substituted from the `runtime_environment` that `open_context` passes),
so a run's results land in `runs/<run_id>/gx/validations/` and its Data Docs in
`runs/<run_id>/data_docs/index.html`, and nothing is written under `keyshift/quality/gx/`. A
context is opened per run, so runs validated one after another in one process each get their own
folders.

GX usage statistics stay off (`analytics_enabled: false` in the yml, and `GX_ANALYTICS_ENABLED=false`
set in the environment before GX is imported); GX 1.24.1 as installed makes no network call to
validate or to build Data Docs.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from keyshift.quality.suites import BATCH_DEFINITION, DATA_DOCS_SITE, DATASOURCE, EXPECTATIONS, SUITES

log = logging.getLogger(__name__)

CONTEXT_DIR = Path(__file__).resolve().parent / "gx"
"""The committed GX context root (holds `great_expectations.yml`)."""

RUN_DIR_VARIABLE = "keyshift_run_dir"
"""The config variable of `great_expectations.yml` that names the run's folder."""

VALIDATIONS_SUBDIR = "gx/validations"
"""Where, under `runs/<run_id>/`, the validation results store writes (JSON)."""

DATA_DOCS_SUBDIR = "data_docs"
"""Where, under `runs/<run_id>/`, the Data Docs site is built (`index.html`)."""

_NOISY_LOGGERS = ("great_expectations", "great_expectations.core", "great_expectations.data_context")


def quiet_great_expectations() -> None:
    """Lower GX's loggers to WARNING and switch its analytics off, before importing it.

    Importing great_expectations under Airflow's logging prints hundreds of INFO lines; the
    environment variable keeps usage statistics off even for a context opened elsewhere.
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def data_docs_dir(run_dir: Path) -> Path:
    """`runs/<run_id>/data_docs/`: the run's Data Docs site (open `index.html`)."""
    return Path(run_dir) / DATA_DOCS_SUBDIR


def open_context(run_dir: Path, context_dir: Path = CONTEXT_DIR):
    """Open the repository's GX file context with its outputs directed to `run_dir`.

    Args:
        run_dir: `runs/<run_id>/` (created if missing); validation results go to
            `run_dir/gx/validations/`, Data Docs to `run_dir/data_docs/`.
        context_dir: the context root (default: the committed `keyshift/quality/gx/`).

    Returns:
        A `great_expectations.data_context.FileDataContext`.

    Raises:
        FileNotFoundError: `context_dir` holds no `great_expectations.yml`.
    """
    quiet_great_expectations()
    if not (Path(context_dir) / "great_expectations.yml").is_file():
        raise FileNotFoundError(f"no great_expectations.yml in {context_dir}; rebuild it with `python -m keyshift.quality.context`")
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    import great_expectations as gx

    return gx.get_context(mode="file", context_root_dir=str(context_dir),
                          runtime_environment={RUN_DIR_VARIABLE: str(run_dir)})


# ---------------------------------------------------------------- writing the committed context

_YML_HEADER = """\
# keyshift's Great Expectations file Data Context (great-expectations 1.x).
# Written by `python -m keyshift.quality.context` from keyshift/quality/suites.py; edit the suites
# there and rebuild. Configuration only: validation results and Data Docs go to the run's folder,
# ${keyshift_run_dir} = runs/<run_id>/ (given by keyshift.quality.context.open_context).
"""


def _rewrite_yml(path: Path) -> None:
    text = path.read_text()
    text = text.replace("config_variables_file_path: uncommitted/config_variables.yml\n", "")
    text = text.replace("base_directory: uncommitted/validations/", "base_directory: ${%s}/%s/" % (RUN_DIR_VARIABLE, VALIDATIONS_SUBDIR))
    text = text.replace("  local_site:", f"  {DATA_DOCS_SITE}:")
    text = text.replace("base_directory: uncommitted/data_docs/local_site/", "base_directory: ${%s}/%s/" % (RUN_DIR_VARIABLE, DATA_DOCS_SUBDIR))
    text = text.replace("show_how_to_buttons: true", "show_how_to_buttons: false")
    text = re.sub(r"(?m)^analytics_enabled:.*$", "analytics_enabled: false", text)
    text = re.sub(r"(?m)^plugins_directory:.*\n", "", text)
    # drop GX's welcome comments: keep our header and the YAML itself
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    body = re.sub(r"\n{3,}", "\n\n", body).strip() + "\nprogress_bars:\n  globally: false\n"
    path.write_text(_YML_HEADER + "\n" + body)


def build_context(target: Path = CONTEXT_DIR) -> Path:
    """(Re)write the GX context folder from `keyshift.quality.suites`.

    Scaffolds a fresh file context in a temporary folder, adds the pandas data source `keyshift`
    with one dataframe asset per suite (batch definition `whole_table`), the suites, one
    validation definition and one checkpoint per suite (its result format and an
    `UpdateDataDocsAction` on site `run_site`), rewrites the yml so outputs go to
    `${keyshift_run_dir}`, drops GX's `uncommitted/` and `plugins/` folders, and replaces
    `target` with the result. The ids in the JSON files are new on each build.

    Args:
        target: the context root to write (default: the committed `keyshift/quality/gx/`).

    Returns:
        `target`.
    """
    quiet_great_expectations()
    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction

    with tempfile.TemporaryDirectory() as tmp:
        context = gx.get_context(mode="file", project_root_dir=tmp)
        source = context.data_sources.add_pandas(DATASOURCE)
        for spec in SUITES:
            batch = source.add_dataframe_asset(spec.asset).add_batch_definition_whole_dataframe(BATCH_DEFINITION)
            suite = context.suites.add(gx.ExpectationSuite(name=spec.name, meta={"notes": f"keyshift: {spec.description}"}))
            for expectation in EXPECTATIONS[spec.name]():
                suite.add_expectation(expectation)
            definition = context.validation_definitions.add(gx.ValidationDefinition(name=spec.name, data=batch, suite=suite))
            context.checkpoints.add(gx.Checkpoint(
                name=spec.name, validation_definitions=[definition],
                actions=[UpdateDataDocsAction(name="update_data_docs", site_names=[DATA_DOCS_SITE])],
                result_format=spec.result_format(),
            ))
        built = Path(tmp) / "gx"
        shutil.rmtree(built / "uncommitted")
        shutil.rmtree(built / "plugins", ignore_errors=True)
        _rewrite_yml(built / "great_expectations.yml")
        target = Path(target)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(built, target)
    log.info("wrote the GX context to %s", target)
    return target


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(build_context())
