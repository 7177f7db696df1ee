import pytest

from asrflow.text import normalize_text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Hello, World!", "hello world"),
        ("Call-Forward on Busy.", "call forward on busy"),
        ("press 1 for help", "press one for help"),
        ("dial 500 now", "dial five hundred now"),
        ("extension 1234", "extension one two three four"),
        ("agent 007", "agent zero zero seven"),
        ("the 11th floor", "the eleventh floor"),
        ("the 1st and 22nd", "the first and twenty second"),
        ("a 28.8 kilobit modem", "a twenty eight point eight kilobit modem"),
        ("1,000 calls", "one thousand calls"),
        ("beep [this is a simple beep tone]", "beep"),
        ("(10 seconds of silence)", ""),
        ("don't 'quote' me", "don't quote me"),
        ("you’re here", "you're here"),
        ("50% off & more", "fifty percent off and more"),
        ("  spaces \t everywhere  ", "spaces everywhere"),
        ("?!...", ""),
        ("0", "zero"),
        ("3D audio", "three d audio"),
    ],
)
def test_english(raw: str, expected: str) -> None:
    assert normalize_text(raw, "en") == expected


def test_spanish_and_french() -> None:
    assert normalize_text("Marque 2 por favor.", "es") == "marque dos por favor"
    assert normalize_text("el 1º piso", "es") == "el primero piso"
    assert normalize_text("Appuyez sur 3, s'il vous plaît.", "fr") == "appuyez sur trois s'il vous plaît"
    assert normalize_text("le 2e étage", "fr") == "le deuxième étage"
    assert normalize_text("ÉCOUTEZ", "fr") == "écoutez"


def test_idempotent() -> None:
    once = normalize_text("Please press 1, then the 11th key-pad [beep].")
    assert normalize_text(once) == once
