"""MkDocs hook: the CLI reference (docs/reference/cli.md) is generated from the click commands.

`keyshift.cli.cli` is the top click group; its sub-commands are added by `keyshift.cli`'s
`_register()` when the `keyshift` command starts (`main`). mkdocs-click reads the group object, so
the hook registers them once before the pages are rendered.
"""

from __future__ import annotations


def on_config(config):
    import keyshift.cli

    keyshift.cli._register()
    return config
