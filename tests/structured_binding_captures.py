#!/usr/bin/env python3
"""Fails when a lambda uses a structured binding of the function around it.

C++17 lets no lambda capture a structured binding ([expr.prim.lambda.capture]; C++20
allows it). g++ accepts it anyway, clang refuses it, and the project builds with g++
but CI's fuzz stage, and users, compile with clang: twice such a capture landed unseen
and broke clang's build (375ed65's checkpoint.cc, and five files of tests and tools).
A plain variable, or an init-capture (`[&part = part]`), is what C++17 allows.

    python3 tests/structured_binding_captures.py [ROOT]   # ROOT: the repository's top

Reads the C++ and CUDA files of src/ kernels/ tools/ tests/ fuzz/ bench/: for each
structured binding (`auto [a, b] = ...`, `for (const auto& [a, b] : ...)`), the lambdas
within the binding's scope whose bodies name one of its names (not as a member, `x.a`,
`x->a`, `X::a`, nor as one of the lambda's own parameters or init-captures). It reads
text, not C++: comments and string literals are blanked first, and a scope is the for
statement of a for header's binding, else the rest of the block around it. It names a
lambda that declares a variable of a binding's name itself, or uses a binding declared at
namespace scope (which needs no capture), though clang accepts both: rename the one.
"""
import pathlib
import re
import sys

FOLDERS = ("src", "kernels", "tools", "tests", "fuzz", "bench")
SUFFIXES = {".cc", ".h", ".cu", ".cuh", ".cpp", ".hpp"}
BINDING = re.compile(r"\bauto(?:\s+const|\s+volatile)*\s*&{0,2}\s*"
                     r"\[\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*\]")
IDENTIFIER_CHAR = re.compile(r"[A-Za-z0-9_]")
# What may stand between a lambda's parameters and its body: specifiers, noexcept(...),
# a return type (decltype(...) too).
LAMBDA_TAIL = re.compile(r"^[\w\s:<>,*&()\->]*$")


def blanked(text):
    """The text with comments, string and character literals as spaces (lines kept)."""
    out = list(text)
    i, n = 0, len(text)

    def blank(start, end):
        for k in range(start, end):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            blank(i, end)
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            blank(i, end)
            i = end
        elif text.startswith('R"', i) and (i == 0 or not IDENTIFIER_CHAR.match(text[i - 1])):
            open_paren = text.find("(", i + 2)
            delimiter = text[i + 2:open_paren]
            end = text.find(")" + delimiter + '"', open_paren)
            end = n if end < 0 else end + len(delimiter) + 2
            blank(i + 1, end)
            i = end
        elif text[i] in "\"'":
            # A digit separator (1'000) is no character literal.
            if text[i] == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and \
                    text[i + 1].isalnum():
                i += 1
                continue
            quote, k = text[i], i + 1
            while k < n and text[k] != quote and text[k] != "\n":
                k += 2 if text[k] == "\\" else 1
            blank(i + 1, min(k, n))
            i = k + 1
        else:
            i += 1
    return "".join(out)


def matching(text, start, opening, closing):
    """The index just past the bracket that closes the one at `start`."""
    depth = 0
    for k in range(start, len(text)):
        if text[k] == opening:
            depth += 1
        elif text[k] == closing:
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


def enclosing_open(text, position, opening, closing):
    """The index of the innermost unclosed `opening` before `position`, or -1."""
    depth = 0
    for k in range(position - 1, -1, -1):
        if text[k] == closing:
            depth += 1
        elif text[k] == opening:
            if depth == 0:
                return k
            depth -= 1
    return -1


def scope_of(text, position):
    """Where a binding declared at `position` can be named: (start, end)."""
    paren = enclosing_open(text, position, "(", ")")
    if paren >= 0 and re.search(r"\bfor\s*$", text[:paren]):
        header_end = matching(text, paren, "(", ")")
        body = header_end
        while body < len(text) and text[body].isspace():
            body += 1
        if body < len(text) and text[body] == "{":
            return header_end, matching(text, body, "{", "}")
        return header_end, text.find(";", body) + 1 or len(text)
    brace = enclosing_open(text, position, "{", "}")
    return position, (matching(text, brace, "{", "}") if brace >= 0 else len(text))


def lambdas(text, start, end):
    """(capture list, parameters, body) of each lambda that begins in [start, end)."""
    for k in range(start, end):
        if text[k] != "[":
            continue
        before = text[:k].rstrip()
        # A subscript or an attribute follows a name, a bracket or a parenthesis; a
        # lambda follows an operator, a comma, an opening or the start of a statement.
        if before and (IDENTIFIER_CHAR.match(before[-1]) or before[-1] in ")]") and \
                not re.search(r"\breturn$", before):
            continue
        if text.startswith("[[", k) or before.endswith("[") or \
                re.search(r"\bauto(?:\s+const|\s+volatile)*\s*&{0,2}$", before):
            continue  # an attribute, a binding
        captures_end = matching(text, k, "[", "]")
        rest = captures_end
        while rest < len(text) and text[rest].isspace():
            rest += 1
        parameters = ""
        if rest < len(text) and text[rest] == "(":
            parameters_end = matching(text, rest, "(", ")")
            parameters = text[rest + 1:parameters_end - 1]
            rest = parameters_end
        body = text.find("{", rest)
        # Between the parameters and the body: specifiers and a return type only.
        if body < 0 or not LAMBDA_TAIL.match(text[rest:body]):
            continue
        # The tail is searched with the body: `-> decltype(k)` names k too.
        yield (text[k + 1:captures_end - 1], parameters,
               text[rest:body] + text[body:matching(text, body, "{", "}")])


def names_used(body, name):
    for found in re.finditer(r"\b%s\b" % re.escape(name), body):
        before = body[:found.start()].rstrip()
        if before.endswith(".") or before.endswith("->") or before.endswith("::"):
            continue
        return True
    return False


def findings(root):
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            text = blanked(path.read_text(encoding="utf-8", errors="replace"))
            for binding in BINDING.finditer(text):
                names = [name.strip() for name in binding.group(1).split(",")]
                start, end = scope_of(text, binding.start())
                for captures, parameters, body in lambdas(text, start, end):
                    initialised = set(re.findall(r"\b([A-Za-z_]\w*)\s*=", captures))
                    own = initialised | set(re.findall(
                        r"\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)?(?:,|$|=)", parameters.strip()))
                    # Named in the capture list (`[k]`, `[&k]`), not as an init-capture.
                    captured = set(re.findall(r"(?:^|,)\s*&?\s*([A-Za-z_]\w*)\s*(?=,|$)",
                                              captures)) - initialised
                    used = [name for name in names if name in captured or
                            (name not in own and names_used(body, name))]
                    if used:
                        line = text.count("\n", 0, binding.start()) + 1
                        yield "%s:%d: a lambda in the scope of the structured binding [%s] " \
                              "uses %s: C++17 lets no lambda capture a structured binding " \
                              "(clang refuses); name it by a plain variable or an " \
                              "init-capture" % (path.relative_to(root), line,
                                                ", ".join(names), ", ".join(used))
                        break


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parent.parent)
    found = sorted(set(findings(root)))
    for finding in found:
        print(finding)
    if found:
        return 1
    print("no lambda uses a structured binding of the function around it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
