"""Key names as computer-use models write them, checked and turned into X keysym names for xdotool.

Anthropic's tool sends one string, ``"ctrl+shift+Escape"`` (xdotool's own syntax, names case-insensitive);
OpenAI's sends a list, ``["CTRL", "L"]``. Both land here: every name is looked up case-insensitively in one
table, so an unknown key is a 422 naming it before anything is pressed (xdotool would otherwise press the
modifiers, fail on the key, and leave them held).
"""

from __future__ import annotations

import string

from grove.core.errors import Invalid

MODIFIERS = {
    "ctrl": "ctrl", "control": "ctrl", "ctl": "ctrl", "control_l": "Control_L", "control_r": "Control_R",
    "shift": "shift", "shift_l": "Shift_L", "shift_r": "Shift_R",
    "alt": "alt", "option": "alt", "alt_l": "Alt_L", "alt_r": "Alt_R",
    "super": "super", "meta": "super", "cmd": "super", "command": "super", "win": "super", "super_l": "Super_L",
}
"""Modifier names (alone they are keys too: ``key("shift")`` presses it)."""

_NAMED = {
    "return": "Return", "enter": "Return", "kp_enter": "KP_Enter",
    "tab": "Tab", "escape": "Escape", "esc": "Escape",
    "backspace": "BackSpace", "delete": "Delete", "del": "Delete", "insert": "Insert", "ins": "Insert",
    "home": "Home", "end": "End",
    "page_up": "Page_Up", "pageup": "Page_Up", "prior": "Prior",
    "page_down": "Page_Down", "pagedown": "Page_Down", "next": "Next",
    "up": "Up", "down": "Down", "left": "Left", "right": "Right",
    "arrowup": "Up", "arrowdown": "Down", "arrowleft": "Left", "arrowright": "Right",
    "space": "space", "print": "Print", "menu": "Menu", "pause": "Pause", "caps_lock": "Caps_Lock",
    "capslock": "Caps_Lock", "num_lock": "Num_Lock", "scroll_lock": "Scroll_Lock",
    "minus": "minus", "plus": "plus", "equal": "equal", "comma": "comma", "period": "period",
    "slash": "slash", "backslash": "backslash", "semicolon": "semicolon", "apostrophe": "apostrophe",
    "quotedbl": "quotedbl", "grave": "grave", "bracketleft": "bracketleft", "bracketright": "bracketright",
    "parenleft": "parenleft", "parenright": "parenright", "exclam": "exclam", "at": "at",
    "numbersign": "numbersign", "dollar": "dollar", "percent": "percent", "asciicircum": "asciicircum",
    "ampersand": "ampersand", "asterisk": "asterisk", "underscore": "underscore", "question": "question",
    "less": "less", "greater": "greater", "colon": "colon", "bar": "bar", "braceleft": "braceleft",
    "braceright": "braceright", "asciitilde": "asciitilde",
}
_PUNCTUATION = {
    "-": "minus", "+": "plus", "=": "equal", ",": "comma", ".": "period", "/": "slash", "\\": "backslash",
    ";": "semicolon", "'": "apostrophe", '"': "quotedbl", "`": "grave", "[": "bracketleft", "]": "bracketright",
    "(": "parenleft", ")": "parenright", "!": "exclam", "@": "at", "#": "numbersign", "$": "dollar",
    "%": "percent", "^": "asciicircum", "&": "ampersand", "*": "asterisk", "_": "underscore", "?": "question",
    "<": "less", ">": "greater", ":": "colon", "|": "bar", "{": "braceleft", "}": "braceright", "~": "asciitilde",
    " ": "space",
}
KEYS: dict[str, str] = {
    **_NAMED,
    **{c: c for c in string.ascii_lowercase},
    **{d: d for d in string.digits},
    **{f"f{n}": f"F{n}" for n in range(1, 25)},
    **{f"kp_{d}": f"KP_{d}" for d in string.digits},
}
"""Every key name accepted (lower-cased) and the keysym xdotool is given."""
MAX_COMBO = 8


def keysym(name: str, *, where: str) -> str:
    """The keysym of one key name, any case (``"ENTER"``, ``"Return"``, ``"l"``, ``"L"``, ``"+"``)."""
    if name in _PUNCTUATION:
        return _PUNCTUATION[name]
    if len(name) == 1 and name.isascii() and name.isalpha():
        # Lower-cased: ["CTRL", "L"] means ctrl+l (xdotool would add shift for the keysym "L"); a capital
        # letter is typed with `type`, or pressed as "shift+l".
        return name.lower()
    found = KEYS.get(name.lower()) or MODIFIERS.get(name.lower())
    if found is None:
        raise Invalid(f"unknown key {name!r} in {where}: use X key names such as Return, Tab, Escape, BackSpace, "
                      "Delete, Home, End, Page_Up, Page_Down, Up, Down, Left, Right, F1..F24, a letter or digit, "
                      "with modifiers ctrl, shift, alt, super joined by '+' (e.g. 'ctrl+shift+t')")
    return found


def combo(text: str, *, where: str = "the key") -> str:
    """``"ctrl+L"`` as xdotool's ``ctrl+l``-style argument, every part checked; ``"+"`` alone is the plus key."""
    if not isinstance(text, str) or not text.strip():
        raise Invalid(f"{where} must be a non-empty key name such as 'Return' or 'ctrl+l'")
    parts = ["+"] if text.strip() == "+" else text.strip().split("+")
    if text.strip().endswith("++"):  # "ctrl++": the plus key with ctrl
        parts = [*text.strip()[:-2].split("+"), "+"]
    if len(parts) > MAX_COMBO or any(not p for p in parts):
        raise Invalid(f"{where} {text!r} is not a key combination: names joined by single '+' signs")
    return "+".join(keysym(p, where=f"{where} {text!r}") for p in parts)


def sequence(text: str, *, where: str = "the key") -> list[str]:
    """Space-separated combinations (``"ctrl+a Delete"``), as xdotool's ``key`` takes them."""
    if not isinstance(text, str) or not text.strip():
        raise Invalid(f"{where} must be a non-empty key name such as 'Return' or 'ctrl+l'")
    if text.strip() == "+" or " " not in text.strip():
        return [combo(text, where=where)]
    return [combo(part, where=where) for part in text.split()]


def chord(keys: object, *, where: str = "'keys'") -> str:
    """OpenAI's ``keys`` list (pressed together: ``["CTRL", "L"]``) as one xdotool combination."""
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
        raise Invalid(f"{where} must be a non-empty list of key names, such as [\"CTRL\", \"L\"]")
    if len(keys) > MAX_COMBO:
        raise Invalid(f"{where} holds {len(keys)} keys; at most {MAX_COMBO} are pressed together")
    return "+".join(keysym(k, where=f"{where} {keys!r}") for k in keys)


def modifiers(text: object, *, where: str = "'text'") -> list[str]:
    """A click's or scroll's held keys (``"ctrl+shift"``), each a modifier; none for None or empty."""
    if text is None or text == "":
        return []
    if not isinstance(text, str):
        raise Invalid(f"{where} must be modifier names joined by '+', such as 'ctrl' or 'ctrl+shift'")
    held = []
    for part in text.split("+"):
        found = MODIFIERS.get(part.strip().lower())
        if found is None:
            raise Invalid(f"{where} {text!r}: {part!r} is not a modifier (ctrl, shift, alt, super)")
        held.append(found)
    return held
