import pytest

from hpcai500_tf import config
from hpcai500_tf.errors import UserError


def test_benchmarks_carry_the_published_problem():
    ic = config.load_benchmark("image_classification")
    assert (ic.target_quality, ic.penalty_exponent, ic.epochs) == (0.763, 5, 90)
    ewa = config.load_benchmark("extreme_weather")
    assert (ewa.target_quality, ewa.epochs, ewa.penalty_exponent_grade) == (0.35, 50, "U")


def test_levels_never_free_the_problem():
    levels, repeatability = config.load_levels()
    assert set(levels) == {"free", "system", "hardware"}
    assert all("L9" not in level.may_differ for level in levels.values())
    assert repeatability.olympic_min_runs == 5


def test_unknown_names():
    with pytest.raises(UserError, match="unknown benchmark 'imagenet'.*image_classification"):
        config.load_benchmark("imagenet")
    with pytest.raises(UserError, match="unknown level 'gold'"):
        config.load_level("gold")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[benchmark\n", "not valid TOML"),
        ("[benchmark]\nname = 'x'\n", "missing key 'benchmark.target_quality'"),
        ("[benchmark]\ntarget_quality = 2.0\n", "target_quality' must be in \\(0, 1\\]"),
        (
            "[benchmark]\ntarget_quality = 'high'\n",
            "'benchmark.target_quality' must be a number, got 'high'",
        ),
    ],
)
def test_malformed_benchmark_file(tmp_path, text, message):
    (tmp_path / "broken.toml").write_text(text)
    with pytest.raises(UserError, match=message) as error:
        config.load_benchmark("broken", tmp_path)
    assert "broken.toml" in str(error.value)


def test_the_earlier_recipe_preset_differs_from_reference_in_its_six_forms_only():
    reference = config.prepare("image_classification", "reference", []).config
    earlier = config.prepare("image_classification", "reference-project", []).config
    differing = {
        f"{section}.{key}"
        for section, table in reference.items()
        for key, value in table.items()
        if earlier[section][key] != value
    }
    assert differing == {
        "model.zero_init_residual",
        "model.logits_initializer",
        "model.stride_padding",
        "model.input_normalisation",
        "optimizer.cosine_start",
        "optimizer.momentum_form",
    }
