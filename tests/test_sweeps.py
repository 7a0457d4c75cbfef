"""The gate ablations and the gamma/beta sweeps on the command line: variant names, dry-run output, bench's list."""

from __future__ import annotations

import pytest

from asymspec_mm.base.errors import UnknownOptionError
from asymspec_mm.bench.cli import main_variants
from asymspec_mm.frontend.variants import build_variants, parse_variant

GAMMAS = [0.4, 0.5, 0.6, 0.7]


def test_gate_aliases_name_the_new_gates():
    assert parse_variant("tuned_kl").config == {"gate": "tuned_kl"}
    assert parse_variant("kl").config == {"gate": "kl"}
    assert parse_variant("asymspec@gate=tuned_kl,lam=0.2").apply().lam == 0.2
    with pytest.raises(UnknownOptionError, match="choose one of cda, fixed, tuned, tuned_kl, kl"):
        parse_variant("asymspec@gate=jsd")


def test_gamma_sweep_multiplies_asymspec_variants_only():
    names = [v.name for v in build_variants("floor,asymspec,kl,sd", gamma=GAMMAS)]
    assert names == (["floor"] + [f"asymspec@gamma={g:g}" for g in GAMMAS] + [f"kl@gamma={g:g}" for g in GAMMAS] + ["sd"])
    configs = {v.name: v.apply() for v in build_variants("asymspec", gamma=GAMMAS)}
    assert [c.gamma for c in configs.values()] == GAMMAS


def test_lam_sweep_applies_to_both_tuned_gates():
    names = [v.name for v in build_variants("tuned,tuned_kl,kl,fixed", lam=[0.05, 0.2])]
    assert names == ["tuned@lam=0.05", "tuned@lam=0.2", "tuned_kl@lam=0.05", "tuned_kl@lam=0.2", "kl", "fixed"]


def test_eval_dry_run_lists_the_gamma_sweep(capsys):
    from asymspec_mm.eval.cli import main

    argv = ["eval", "mathvista", "--dataset", "minivista", "--minivista-n", "3", "--dry-run"]
    assert main(argv + ["--methods", "floor,asymspec,tuned_kl", "--gamma", "0.4,0.5,0.6,0.7", "--beta", "0.5,1"]) == 0
    out = capsys.readouterr().out
    assert "x 17 variants: floor, asymspec@beta=0.5,gamma=0.4, asymspec@beta=0.5,gamma=0.5," in out
    assert out.rstrip().endswith("tuned_kl@beta=1,gamma=0.6, tuned_kl@beta=1,gamma=0.7")


def test_bench_main_variants_sweep_gamma_and_beta():
    assert main_variants("floor;sd;asymspec", gamma="0.4,0.5,0.6,0.7") == ["floor", "sd"] + [f"asymspec@gamma={g:g}" for g in GAMMAS]
    assert main_variants("asymspec;asymspec@beta=0", beta="0.5,1", gamma="0.5") == [
        "asymspec@beta=0.5,gamma=0.5",
        "asymspec@beta=1,gamma=0.5",
        "asymspec@beta=0,gamma=0.5",
    ]
    assert main_variants("floor;asymspec") == "floor;asymspec"  # no sweep: the list as given
    with pytest.raises(UnknownOptionError, match="--gamma"):
        main_variants("asymspec", gamma="0.5,nan")


def test_bench_cli_passes_the_sweep_and_sd_drafter():
    """bench's parser reads --gamma/--beta/--sd-drafter and hands run_bench the swept variant names."""
    import argparse

    from asymspec_mm.bench import cli as bench_cli

    parser = argparse.ArgumentParser()
    bench_cli.add_bench_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", "--variants", "floor;asymspec", "--gamma", "0.4,0.6", "--sd-drafter", "some/dir"])
    seen = bench_cli.bench_options(args)
    assert seen["variants"] == ["floor", "asymspec@gamma=0.4", "asymspec@gamma=0.6"] and seen["sd_drafter"] == "some/dir"
