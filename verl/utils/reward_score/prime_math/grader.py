"""`math_equal`: numeric and symbolic equality of two answers, the symbolic part (sympy) in a child process
with a time limit so a pathological expression cannot hang the reward worker."""
from __future__ import annotations

import math
import re

from verl.utils.py_functional import timeout_limit

__all__ = ["math_equal", "symbolic_equal", "parse_digits"]

SYMPY_TIMEOUT_S = 5.0


def parse_digits(text) -> float | None:
    """A number from '1,234', '50%' (0.5) or '3.0'; None when it is not one."""
    text = re.sub(",", "", str(text)).strip()
    try:
        return float(text)
    except ValueError:
        if text.endswith("%"):
            text = text[:-1].rstrip("\\")
            try:
                return float(text) / 100
            except ValueError:
                return None
    return None


def _to_sympy(text: str):
    from sympy.parsing.sympy_parser import parse_expr, standard_transformations, implicit_multiplication_application

    text = text.replace("^", "**")
    if "\\" in text:
        from sympy.parsing.latex import parse_latex

        try:
            return parse_latex(text)
        except Exception:  # antlr4 missing or not LaTeX: fall back to the plain parser
            text = re.sub(r"\\(frac|dfrac|tfrac)\{([^{}]*)\}\{([^{}]*)\}", r"(\2)/(\3)", text)
            text = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", text).replace("\\pi", "pi").replace("\\", "")
    return parse_expr(text, transformations=standard_transformations + (implicit_multiplication_application,),
                      evaluate=True)


def _symbolic_equal_now(a: str, b: str) -> bool:
    import sympy

    try:
        left, right = _to_sympy(a), _to_sympy(b)
    except Exception:
        return False
    try:
        if sympy.simplify(left - right) == 0:
            return True
    except Exception:
        pass
    try:
        return bool(abs(complex(sympy.N(left)) - complex(sympy.N(right))) <= 1e-6)
    except Exception:
        return False


_symbolic_equal_limited = timeout_limit(SYMPY_TIMEOUT_S)(_symbolic_equal_now)


def symbolic_equal(a: str, b: str, timeout: bool = True) -> bool:
    """sympy says `a - b` simplifies to 0 (or evaluates within 1e-6); False when it runs past the limit."""
    if not timeout:
        return _symbolic_equal_now(a, b)
    try:
        return _symbolic_equal_limited(a, b)
    except (TimeoutError, RuntimeError):
        return False


def math_equal(prediction, reference, include_percentage: bool = True, is_close: bool = True,
               timeout: bool = False, pi: float = math.pi) -> bool:
    """Equal as strings, as numbers (also reference/100 and reference*100 with `include_percentage`, within
    relative 1e-4 with `is_close`), element-wise as tuples, or symbolically."""
    if prediction is None or reference is None:
        return False
    pred, ref = str(prediction).strip(), str(reference).strip()
    if pred.lower() == ref.lower():
        return True
    if "\\pi" in pred or "\\pi" in ref:
        pred, ref = pred.replace("\\pi", f"*{pi}").lstrip("*"), ref.replace("\\pi", f"*{pi}").lstrip("*")
    p_num, r_num = parse_digits(pred), parse_digits(ref)
    if p_num is not None and r_num is not None:
        targets = [r_num / 100, r_num, r_num * 100] if include_percentage else [r_num]
        return any(math.isclose(p_num, t, rel_tol=1e-4) if is_close else p_num == t for t in targets)
    brackets = "()[]"
    if pred[:1] in brackets and ref[:1] in brackets and pred[-1:] in brackets and ref[-1:] in brackets:
        p_parts, r_parts = pred[1:-1].split(","), ref[1:-1].split(",")
        if len(p_parts) == len(r_parts) and len(p_parts) > 1:
            return all(math_equal(p, r, include_percentage, is_close, timeout, pi) for p, r in zip(p_parts, r_parts))
    return symbolic_equal(pred, ref, timeout=timeout)
