"""Numbers in their units, as every report prints them: one owner of the decimals per unit
(``summary``, ``evidence``, the verdict lines, the fleet and traffic tables import them)."""

import math

# decimals per unit, chosen so that no printed digit is finer than the measurement
DIGITS = {
    "°C": 1,
    "% of one core": 0,
    "tok/s": 1,
    "gaps": 0,
    "s": 1,
    "min": 1,
    "W": 1,
    "J": 0,
    "J/token": 3,
    "tok/J": 2,
}
SHORT_UNIT = {"% of one core": "% CPU"}


def fmt(value: float | None, unit: str = "", digits: int | None = None, sign: bool = False) -> str:
    """``89.53, "°C"`` → ``89.5 °C``; NaN → ``–``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    digits = DIGITS.get(unit, 2) if digits is None else digits
    value = value if round(value, digits) else 0.0  # no "−0"
    text = f"{value:{'+' if sign else ''}.{digits}f}".replace("-", "−")
    unit = SHORT_UNIT.get(unit, unit)
    return f"{text} {unit}" if unit else text
