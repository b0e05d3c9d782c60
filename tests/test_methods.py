"""Method slugs: parsing in any order, one canonical spelling, errors that say what is allowed."""

from __future__ import annotations

import pytest
from pretrain_planner.planning import methods
from pretrain_planner.planning.methods import ALL_PARTS, BASES, SHARDING, Method, parse, parse_canonical
from pretrain_planner.schema import ConfigError


@pytest.mark.parametrize(
    ("slug", "expected"),
    [
        ("naive", Method("naive")),
        ("fl", Method("fl")),
        ("fl+ac", Method("fl", checkpointing=True)),
        ("fl+zero1", Method("fl", sharding="zero1")),
        ("fl+fsdp-full", Method("fl", sharding="fsdp-full")),
        ("fl+zero3+off", Method("fl", sharding="zero3", offload=True)),
        ("fl+ac+fsdp-grad+off", Method("fl", True, "fsdp-grad", True)),
        ("naive+ac", Method("naive", checkpointing=True)),
    ],
)
def test_parse(slug, expected):
    method = parse(slug)
    assert method == expected
    assert method.slug == slug  # these are written canonically already
    assert parse_canonical(slug) == expected


@pytest.mark.parametrize(
    ("slug", "canonical"),
    [
        ("fl+off+zero3", "fl+zero3+off"),
        ("fl+zero3+ac", "fl+ac+zero3"),
        ("fl+off+ac+zero2", "fl+ac+zero2+off"),
        ("fl+off+fsdp-full+ac", "fl+ac+fsdp-full+off"),
        ("fl + ac", "fl+ac"),
    ],
)
def test_any_order_gives_the_canonical_slug(slug, canonical):
    assert parse(slug).slug == canonical
    assert parse(canonical).slug == canonical  # idempotent


def test_every_combination_has_one_slug():
    slugs = set()
    for base in BASES:
        for ac in (False, True):
            for shard in (None, *SHARDING):
                for off in (False, True):
                    m = Method(base, ac, shard, off)
                    assert parse(m.slug) == m
                    assert parse_canonical(m.slug) == m
                    slugs.add(m.slug)
    assert len(slugs) == len(BASES) * 2 * (len(SHARDING) + 1) * 2


def test_free_lunch_and_describe():
    assert parse("fl").free_lunch and not parse("naive").free_lunch
    text = parse("fl+off+ac+zero3").describe()
    assert text.startswith(BASES["fl"])
    assert methods.CHECKPOINTING["ac"] in text
    assert SHARDING["zero3"] in text
    assert methods.OFFLOAD["off"] in text
    assert parse("naive").describe() == BASES["naive"]


def _allowed_parts_listed(msg: str) -> bool:
    return all(p in msg for p in ALL_PARTS)


@pytest.mark.parametrize("slug", ["fl+flash", "fl+zero4", "naive+AC", "fl+", "fl+ac+compile"])
def test_unknown_part(slug):
    with pytest.raises(ConfigError) as info:
        parse(slug, where="config.yaml: sweep.methods[2]")
    msg = str(info.value)
    assert msg.startswith("config.yaml: sweep.methods[2]")
    assert repr(slug) in msg
    assert _allowed_parts_listed(msg), msg


@pytest.mark.parametrize("slug", ["fl+ac+ac", "fl+off+zero3+off", "fl+zero1+zero2", "fl+zero3+fsdp-full"])
def test_repeated_part_or_two_shardings(slug):
    with pytest.raises(ConfigError) as info:
        parse(slug, where="sweep.methods[0]")
    msg = str(info.value)
    assert "sweep.methods[0]" in msg
    assert "unknown or repeated" in msg
    assert "at most one sharding" in msg
    assert _allowed_parts_listed(msg), msg


@pytest.mark.parametrize("slug", ["ac", "zero3+fl", "ac+fl", "", "free-lunch", "FL"])
def test_missing_base(slug):
    with pytest.raises(ConfigError) as info:
        parse(slug, where="here")
    msg = str(info.value)
    assert msg.startswith("here:")
    assert "naive" in msg and "fl" in msg
    assert "base method" in msg


def test_default_where_is_method():
    with pytest.raises(ConfigError, match=r"^method: "):
        parse("nope")


@pytest.mark.parametrize("slug", ["fl+off+zero3", "fl+zero3+ac", "fl + ac", "fl+off+ac+zero2"])
def test_parse_canonical_rejects_non_canonical(slug):
    with pytest.raises(ValueError, match="not canonical") as info:
        parse_canonical(slug)
    assert repr(parse(slug).slug) in str(info.value)  # says what the canonical spelling is


def test_parse_canonical_rejects_invalid():
    with pytest.raises(ConfigError):
        parse_canonical("fl+bogus")


# ------------------------------------------------------------------------------------------ extra parts


@pytest.mark.parametrize(
    ("slug", "expected"),
    [
        ("fl+fa2", Method("fl", kernels=("fa2",))),
        ("fl+liger", Method("fl", kernels=("liger",))),
        ("fl+fa2+liger", Method("fl", kernels=("fa2", "liger"))),
        ("fl+flce", Method("fl", fused_ce=True)),
        ("fl+cstep", Method("fl", compile_mode="cstep")),
        ("fl+cg", Method("fl", compile_mode="cg")),
        ("fl+fa2+liger+flce+cstep+ac+zero2+off", Method("fl", True, "zero2", True, ("fa2", "liger"), True, "cstep")),
    ],
)
def test_extra_parts_parse_canonically(slug, expected):
    assert parse(slug) == expected
    assert expected.slug == slug
    assert parse_canonical(slug) == expected


@pytest.mark.parametrize(
    ("slug", "canonical"),
    [
        ("fl+ac+flce", "fl+flce+ac"),
        ("fl+liger+fa2", "fl+fa2+liger"),
        ("fl+zero3+off+cg+fa2", "fl+fa2+cg+zero3+off"),
        ("fl+cstep+flce", "fl+flce+cstep"),
    ],
)
def test_extra_parts_any_order(slug, canonical):
    assert parse(slug).slug == canonical
    with pytest.raises(ValueError, match="not canonical"):
        parse_canonical(slug)


def test_old_slugs_and_positional_construction_unchanged():
    """Adding parts must not move any existing cell's path: the old fields, order and slugs are as before."""
    for slug in ("naive", "fl", "fl+ac", "fl+zero3+off", "fl+ac+fsdp-grad+off", "naive+ac+zero1"):
        m = parse(slug)
        assert m.slug == slug and m.extras == [] and not m.flash_attn and not m.liger
        assert Method(m.base, m.checkpointing, m.sharding, m.offload) == m


@pytest.mark.parametrize("slug", ["fl+cstep+cg", "fl+fa2+fa2", "fl+flce+flce"])
def test_extra_parts_at_most_once(slug):
    with pytest.raises(ConfigError, match="unknown or repeated"):
        parse(slug)


def test_extras_are_listed_and_described():
    text = parse("fl+fa2+flce+cg").describe()
    for part in ("fa2", "flce", "cg"):
        assert methods.ALL_PARTS[part] in text
    assert set(methods.EXTRA_PARTS) == {"fa2", "liger", "flce", "cstep", "cg"}
    with pytest.raises(ValueError):
        Method("fl", kernels=("fa3",))
    assert Method("fl", kernels=("liger", "fa2")).kernels == ("fa2", "liger")  # one Method per slug
