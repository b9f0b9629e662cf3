"""README's configuration reference is the configuration: every setting of `Limits`, `Timing`
and `Topics` appears there with its default, and nothing else does; every cluster-wide
`StateLimits` bound (not a node setting) is in docs/semantics.md's table of limits.

An operator reads README to learn which limit decided an outcome; a setting added to the
dataclasses without a line there, or a default changed in one place only, fails here.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from cluster.config import Limits, NodeConfig, Timing, Topics
from statemachine.limits import StateLimits

ROOT = Path(__file__).resolve().parents[2]


def reference() -> dict[str, Any]:
    """The TOML block of README's "Running nodes" section, parsed."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Running nodes") :]
    block = re.search(r"```toml\n(.*?)```", section, re.DOTALL)
    assert block is not None, "README's Running nodes section has no TOML block"
    return tomllib.loads(block[1])


@pytest.mark.parametrize(
    ("table", "cls"), [("limits", Limits), ("timing", Timing), ("topics", Topics)]
)
def test_every_setting_is_in_the_reference_with_its_default(table: str, cls: type) -> None:
    shown = reference()[table]
    defaults = {f.name: getattr(cls(), f.name) for f in fields(cls)}
    assert sorted(shown) == sorted(defaults), f"[{table}] in README differs from {cls.__name__}"
    assert shown == defaults, f"README's [{table}] shows other defaults than {cls.__name__}"


def test_the_reference_is_a_valid_configuration() -> None:
    config = NodeConfig.from_mapping({**reference(), "cluster_secret": None})
    assert config.limits == Limits()
    assert config.timing == Timing()
    assert config.topics == Topics()


def test_every_cluster_wide_bound_is_in_the_semantics_table() -> None:
    semantics = (ROOT / "docs" / "semantics.md").read_text()
    missing = [f.name for f in fields(StateLimits) if f"`{f.name}`" not in semantics]
    assert missing == [], f"StateLimits bounds docs/semantics.md does not name: {missing}"
