#!/usr/bin/env python3
"""The import structure of a crate's source tree: fails on an import circle.

    ci/imports.py kmod/src [--max-upward N]

Nodes are the crate's files, a file's submodules folded into it (so
`engine/physqp/post.rs` counts as `engine/physqp`). An edge is every
`crate::` or `super::` path outside comments and `#[cfg(test)] mod tests`
(a `use`, each path of a `use` group, or a path inline) that names another
node. The check fails (exit
1) when the edges form a circle, naming its files; it reports the imports
that run from a file up to a module that contains it (its parent's
`mod.rs`, or the crate root), and fails when there are more than
`--max-upward` of them (default: no limit). A circle's edges are listed,
each with the first path that makes it. Relative paths to a file's own
children (`use child::Item` in a `mod.rs`) are the module tree itself, not
imports, and are not counted.
"""

import argparse
import collections
import os
import re
import sys


def modules(root):
    files = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            parts = os.path.relpath(path, root)[:-3].split("/")
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            files[tuple(parts)] = path
    return files


def source(path):
    text = open(path, encoding="utf-8").read()
    cut = text.find("#[cfg(test)]\nmod tests")
    if cut >= 0:
        text = text[:cut]
    return expand_groups(re.sub(r"//.*", "", text))


def expand_groups(text):
    """`use a::{b, c::d};` -> `use a::b; use a::c::d;` (nested groups too),
    so that every path of a group is seen whole."""
    group = re.compile(r"((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^{}]*)\}")
    while True:
        m = group.search(text)
        if not m:
            return text
        prefix, items = m.group(1), m.group(2)
        paths = []
        for item in items.split(","):
            item = item.strip()
            if not item:
                continue
            if item == "self":
                paths.append(prefix)
            else:
                paths.append(prefix + "::" + item.split(" as ")[0].strip())
        text = text[: m.start()] + "; ".join(paths) + text[m.end() :]


def resolve(files, module, segments):
    cur = list(module)
    if segments[0] == "crate":
        cur, segments = [], segments[1:]
    else:
        while segments and segments[0] in ("super", "self"):
            if segments[0] == "super":
                cur = cur[:-1]
            segments = segments[1:]
    best = tuple(cur)
    for i in range(len(segments) + 1):
        candidate = tuple(cur + segments[:i])
        if candidate in files:
            best = candidate
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--max-upward", type=int, default=None)
    args = ap.parse_args()
    files = modules(args.root)
    path_re = re.compile(
        r"\b((?:crate|super)(?:::(?:super|self))*(?:::[A-Za-z_][A-Za-z0-9_]*)+)"
    )
    edges = collections.defaultdict(set)
    # The first path that made each edge, named when it closes a circle.
    why = {}
    upward = collections.Counter()
    for module, path in files.items():
        # Test modules (`tests.rs`, or `NAME_tests.rs` declared with
        # `#[path]` as `NAME`'s `mod tests`) import their parent by design.
        if module and (module[-1] == "tests" or module[-1].endswith("_tests")):
            continue
        for m in path_re.finditer(source(path)):
            target = resolve(files, module, m.group(1).split("::"))
            src, dst = module[:2], target[:2]
            if len(target) < len(module) and module[: len(target)] == target:
                upward[("/".join(module), "/".join(target) or "<crate root>")] += 1
            if dst != src and not (len(dst) < len(src) and src[: len(dst)] == dst):
                edges[src].add(dst)
                why.setdefault((src, dst), (path, m.group(1)))
    # Tarjan's strongly connected components.
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted("/".join(m) for m in comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    n_up = sum(upward.values())
    print(f"{args.root}: {len(files)} files, {sum(len(e) for e in edges.values())} imports between them")
    print(f"upward imports (a file importing from a module that contains it): {n_up}")
    for (a, b), n in sorted(upward.items()):
        print(f"  {a} -> {b}: {n}")
    ok = True
    for c in circles:
        print("import circle: " + " -> ".join(c))
        members = {tuple(m.split("/")) for m in c}
        for a in sorted(members):
            for b in sorted(edges.get(a, ())):
                if b in members:
                    path, text = why[(a, b)]
                    print(f"  {'/'.join(a)} -> {'/'.join(b)} (e.g. {path}: {text})")
        ok = False
    if args.max_upward is not None and n_up > args.max_upward:
        print(f"more than {args.max_upward} upward imports")
        ok = False
    print("ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
