"""The one mapping of Rust errors to Python exceptions (rust/specrt-py/src/errors.rs): each `SpecError` variant to
its class by variant alone, never by its message."""

from __future__ import annotations

import pytest

from specrt import _specrt, errors

#: Rust variant -> the class its exception must be exactly (users catch these; subclasses would also match).
CLASS_OF_VARIANT = {
    "Config": errors.ConfigError,
    "Setting": errors.ConfigError,
    "Shape": errors.ShapeError,
    "Vocab": errors.VocabError,
    "NonFinite": errors.NonFiniteLogitsError,
    "Length": errors.SequenceLengthError,
    "Backend": errors.BackendError,
    "Provider": errors.ProviderError,
    "NotFound": errors.ModelFileNotFoundError,
    "Io": errors.ModelFileError,
    "ModelFormat": errors.ModelFileError,
    "Cancelled": errors.GenerationCancelled,
    "Internal": errors.InternalError,
    "Panic": errors.InternalError,
}

#: Messages that name another class's words: none of them may change the class.
MISLEADING = ["model.onnx not found", "No such file or directory (os error 2)", "plain words"]


def test_every_rust_variant_has_an_expected_class() -> None:
    assert sorted(_specrt.ERROR_VARIANTS) == sorted(CLASS_OF_VARIANT)


@pytest.mark.parametrize("message", MISLEADING)
@pytest.mark.parametrize(("variant", "cls"), sorted(CLASS_OF_VARIANT.items()))
def test_each_rust_variant_maps_to_its_class_whatever_the_message(
    variant: str, cls: type[errors.SpecrtError], message: str
) -> None:
    err = _specrt.error_for(variant, message)
    assert type(err) is cls, f"{variant} with message {message!r} became {type(err).__name__}, not {cls.__name__}"
    assert isinstance(err, errors.SpecrtError)
    if variant != "Cancelled":
        assert message in str(err)


def test_a_setting_error_carries_its_field_and_a_config_error_none() -> None:
    assert _specrt.error_for("Setting", "temperature -1 is invalid").field == "field"
    assert _specrt.error_for("Config", "q 1.5 is invalid").field is None


def test_the_builtin_bases_let_callers_catch_by_kind() -> None:
    assert isinstance(_specrt.error_for("NotFound", "x"), FileNotFoundError)
    assert not isinstance(_specrt.error_for("Io", "x not found"), FileNotFoundError)
    assert not isinstance(_specrt.error_for("ModelFormat", "x not found"), FileNotFoundError)
    assert isinstance(_specrt.error_for("ModelFormat", "x"), OSError)
    assert isinstance(_specrt.error_for("Setting", "x"), ValueError)


def test_an_unknown_variant_name_is_refused() -> None:
    with pytest.raises(ValueError, match='variant "Nope" is invalid'):
        _specrt.error_for("Nope", "x")
