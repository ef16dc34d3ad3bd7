"""What a lowering handler's source says about one format op type, read with `ast` for tools/make_operators_doc.py:
the canonical ops it emits, the params and resources it reads, when it refuses (`unsupported`: UnsupportedOpError)
and when it calls the model malformed (`fail`: ModelFormatError).

The walk follows the handler into the lowering helpers it calls by name (binding literal arguments to their
parameters) and into the handler a call dispatches to (`HANDLERS[type_2d](...)`). It resolves op names from
literals, closures (`_unary("Relu")`), module tables indexed by the op type (`_SIMPLE[ctx.type]`) and conditions on
the op type (`"max" in ctx.type.lower()`), skipping branches the op type rules out. An op name it cannot resolve
makes `unresolved` true.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

EMIT = {"become", "emit", "out", "tmp"}  # Ctx methods whose first argument is the canonical op type
NAMED_READS = {"p", "has", "arg", "weight", "attr"}  # Ctx methods whose first argument names a param or resource
POSITIONAL_READS = {"i", "f", "counted"}  # TNN Ctx methods reading the layer's positional params
STR_METHODS = {"lower", "upper", "replace", "startswith", "endswith"}
ITERATORS = {"range": range, "enumerate": enumerate}
MAX_DEPTH = 8


@dataclass
class Facts:
    ops: list[str] = field(default_factory=list)  # canonical op types, in the order the source emits them
    bypass: bool = False  # the node leaves the graph (its output is its input)
    reads: list[str] = field(default_factory=list)  # named params, attributes and resources
    positions: set[int] = field(default_factory=set)  # TNN positional params read
    computed_positions: bool = False  # TNN positions the walk cannot list (loops, counted lists)
    # (helper the check is in, '' for the handler itself; condition or "always"; message)
    refusals: list[tuple[str, str, str]] = field(default_factory=list)
    malformed: list[tuple[str, str, str]] = field(default_factory=list)
    unresolved: bool = False


def _add(items: list, item) -> None:
    if item not in items:
        items.append(item)


class _Unknown(Exception):
    """An expression whose value depends on the model, not only on the op type."""


_TREES: dict[str, ast.Module] = {}


def _tree(module: str) -> ast.Module:
    if module not in _TREES:
        _TREES[module] = ast.parse(inspect.getsource(sys.modules[module]))
    return _TREES[module]


def _string_literals(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def source_node(fn: Callable) -> ast.FunctionDef | ast.Lambda:
    """The `def` or `lambda` of `fn` in its module's source."""
    code, tree = fn.__code__, _tree(fn.__module__)
    lambdas = []
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef) and n.name == fn.__name__:
            if code.co_firstlineno in (n.lineno, min([n.lineno] + [d.lineno for d in n.decorator_list])):
                return n
        elif isinstance(n, ast.Lambda) and fn.__name__ == "<lambda>" and n.lineno == code.co_firstlineno:
            lambdas.append(n)
    consts = {c for c in code.co_consts if isinstance(c, str)}
    fitting = [n for n in lambdas if _string_literals(n) <= consts] if len(lambdas) > 1 else lambdas
    if len(fitting) != 1:
        raise LookupError(f"cannot find the source of {fn.__module__}.{fn.__qualname__}")
    return fitting[0]


class _Walk:
    """One handler (or helper) body, for one op type."""

    def __init__(self, fn: Callable, op_type: str, canonical: Collection[str], handlers: dict[str, Callable],
                 facts: Facts, bound: dict | None = None, depth: int = 0, seen: set | None = None):
        self.fn, self.op_type, self.canonical, self.handlers = fn, op_type, canonical, handlers
        self.facts, self.depth, self.seen = facts, depth, seen if seen is not None else set()
        self.node = source_node(fn)
        self.cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ()),
                              strict=True))
        self.bound = bound or {}
        args = self.node.args.args
        self.ctx_names = {args[0].arg} if args else set()
        self.local_defs = {n.name: n for n in ast.walk(self.node)
                           if isinstance(n, ast.FunctionDef) and n is not self.node}
        self.called_locals: set[str] = set()
        self.locals: dict[str, list[ast.expr]] = {}
        for n in ast.walk(self.node):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                self.locals.setdefault(n.targets[0].id, []).append(n.value)

    # -- values ----------------------------------------------------------------------------------------------------
    def _name(self, name: str):
        if name in self.bound:
            return self.bound[name]
        if name in self.cells:
            return self.cells[name]
        if name in self.locals:
            if len(self.locals[name]) != 1:
                raise _Unknown(name)
            return self.value(self.locals[name][0])
        if name in self.fn.__globals__:
            return self.fn.__globals__[name]
        raise _Unknown(name)

    def value(self, node: ast.expr):
        """The value of `node` when it follows from the op type and the module's constants alone."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Attribute) and node.attr == "type" and isinstance(node.value, ast.Name) \
                and node.value.id in self.ctx_names:
            return self.op_type
        if isinstance(node, ast.Name):
            v = self._name(node.id)
            if callable(v) and not isinstance(v, type):
                raise _Unknown(node.id)
            return v
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self.value(e) for e in node.elts)
        if isinstance(node, ast.Subscript):
            return self.value(node.value)[self.value(node.slice)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ITERATORS:
            return list(ITERATORS[node.func.id](*(self.value(a) for a in node.args)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STR_METHODS:
            return getattr(self.value(node.func.value), node.func.attr)(*(self.value(a) for a in node.args))
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            a, b = self.value(node.left), self.value(node.comparators[0])
            return _compare(node.ops[0], a, b)
        if isinstance(node, ast.BoolOp):
            vals = [self.value(v) for v in node.values]
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not self.value(node.operand)
        raise _Unknown(ast.unparse(node))

    def truth(self, node: ast.expr) -> bool | None:
        try:
            return bool(self.value(node))
        except (_Unknown, TypeError, KeyError, IndexError, AttributeError):
            return None

    def op_names(self, node: ast.expr) -> set[str] | None:
        """The op types `node` may name; None when the walk cannot tell."""
        try:
            v = self.value(node)
            return {v} if isinstance(v, str) else None
        except (_Unknown, TypeError, KeyError, IndexError, AttributeError):
            pass
        if isinstance(node, ast.JoinedStr):
            parts = [{p.value} if isinstance(p, ast.Constant) else self.op_names(p.value) for p in node.values]
            return None if None in parts else {"".join(c) for c in itertools.product(*parts)}
        if isinstance(node, ast.IfExp):
            pick = self.truth(node.test)
            if pick is not None:
                return self.op_names(node.body if pick else node.orelse)
            names = [self.op_names(b) for b in (node.body, node.orelse) if not self._is_refusal(b)]
            return None if None in names else set().union(*names)
        if isinstance(node, ast.BoolOp):  # `TABLE.get(k) or c.unsupported(...)`
            names = [self.op_names(v) for v in node.values if not self._is_refusal(v)]
            return None if None in names else set().union(*names)
        if isinstance(node, ast.Subscript):
            return self._table_values(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            return self._table_values(node.func.value)
        if isinstance(node, ast.Name) and node.id in self.locals:
            names = [self.op_names(e) for e in self.locals[node.id]]
            return None if None in names else set().union(*names)
        return None

    def _table_values(self, node: ast.expr) -> set[str] | None:
        try:
            table = self.value(node) if not isinstance(node, ast.Dict) else {
                self.value(k): self.value(v) for k, v in zip(node.keys, node.values, strict=True)}
        except (_Unknown, TypeError, KeyError):
            return None
        values = table.values() if isinstance(table, dict) else table
        return {v for v in values if isinstance(v, str)} or None

    # -- walking ---------------------------------------------------------------------------------------------------
    def run(self) -> None:
        if isinstance(self.node, ast.Lambda):
            self.expr(self.node.body, [])
            return
        self.block(self.node.body, [])
        for name, local in self.local_defs.items():  # local helpers never called by name: taken as called
            if name not in self.called_locals:
                self.block(local.body, [])

    def block(self, stmts: list, when: list[str]) -> None:
        for s in stmts:
            if isinstance(s, ast.If):
                pick = self.truth(s.test)
                if pick is None:
                    self.expr(s.test, when)
                    self.block(s.body, [*when, ast.unparse(s.test)])
                    self.block(s.orelse, [*when, f"not ({ast.unparse(s.test)})"])
                else:
                    self.block(s.body if pick else s.orelse, when)
            elif isinstance(s, ast.For):
                self.expr(s.iter, when)
                self.each(s.target, s.iter, lambda w=when, s=s: self.block(s.body, w))
                self.block(s.orelse, when)
            elif isinstance(s, (ast.While, ast.With, ast.Try)):
                if isinstance(s, ast.While):
                    self.expr(s.test, when)
                for part in ("body", "orelse", "finalbody"):
                    self.block(getattr(s, part, []), when)
                for h in getattr(s, "handlers", []):
                    self.block(h.body, when)
            elif isinstance(s, ast.FunctionDef):  # walked where it is called (`call`)
                continue
            else:
                for child in ast.iter_child_nodes(s):
                    if isinstance(child, ast.expr):
                        self.expr(child, when)

    def each(self, target: ast.expr, iterable: ast.expr, walk: Callable[[], None]) -> None:
        """Walks once per item of a literal `iterable`, its names bound (`for name in ("weight", "bias")`);
        once, unbound, when the items depend on the model."""
        try:
            items = list(self.value(iterable))
        except (_Unknown, TypeError, KeyError, IndexError, AttributeError):
            items = None
        names = [target.id] if isinstance(target, ast.Name) else \
            [e.id for e in target.elts] if isinstance(target, ast.Tuple) and \
            all(isinstance(e, ast.Name) for e in target.elts) else None
        if items is None or names is None:
            walk()
            return
        saved = dict(self.bound)
        for item in items:
            values = [item] if len(names) == 1 else list(item)
            if len(values) != len(names):
                continue
            self.bound.update(zip(names, values, strict=True))
            walk()
        self.bound = saved

    def expr(self, node: ast.expr, when: list[str]) -> None:
        if isinstance(node, ast.IfExp):
            pick = self.truth(node.test)
            self.expr(node.test, when)
            if pick is not True:
                self.expr(node.orelse, [*when, f"not ({ast.unparse(node.test)})"] if pick is None else when)
            if pick is not False:
                self.expr(node.body, [*when, ast.unparse(node.test)] if pick is None else when)
            return
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            for k, v in enumerate(node.values):
                prior = [f"not {ast.unparse(p)}" for p in node.values[:k]]
                self.expr(v, [*when, *prior])
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) \
                and len(node.generators) == 1:
            gen = node.generators[0]
            self.expr(gen.iter, when)
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            self.each(gen.target, gen.iter, lambda: [self.expr(e, when) for e in [*gen.ifs, *parts]])
            return
        if isinstance(node, ast.Call):
            self.call(node, when)
            if isinstance(node.func, ast.Attribute):
                self.expr(node.func.value, when)
            for child in [*node.args, *(k.value for k in node.keywords)]:
                self.expr(child, when)
            return
        if isinstance(node, ast.Subscript) and _is_params_or_attrs(node.value):
            self._read(node.slice)
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In) \
                and _is_params_or_attrs(node.comparators[0]):
            self._read(node.left)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child, when)
            elif isinstance(child, ast.comprehension):
                self.expr(child.iter, when)

    def _is_refusal(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("unsupported", "fail")

    def call(self, node: ast.Call, when: list[str]) -> None:
        f, facts = node.func, self.facts
        first = node.args[0] if node.args else None
        if isinstance(f, ast.Attribute):
            if f.attr in EMIT and first is not None:
                self._emitted(self.op_names(first))
            elif f.attr == "alias":
                self._emitted({"Identity"})
            elif f.attr == "bypass":
                facts.bypass = True
            elif f.attr in ("unsupported", "fail"):
                helper = self.fn.__name__ if self.depth else ""
                _add(facts.refusals if f.attr == "unsupported" else facts.malformed,
                     (helper, _conjunction(when), self.template(first)))
            elif f.attr in NAMED_READS and first is not None:
                self._read(first)
            elif f.attr in POSITIONAL_READS and first is not None:
                self._position(first)
            elif f.attr == "get" and _is_params_or_attrs(f.value) and first is not None:
                self._read(first)
            return
        if isinstance(f, ast.Subscript):  # HANDLERS[type](Ctx(...)): lowered by that type's handler
            target = self._dispatch_target(f)
            if target is not None:
                self._follow(self.handlers[target], target, node)
            return
        if isinstance(f, ast.Name) and f.id in self.local_defs:
            self._call_local(self.local_defs[f.id], node, when)
            return
        if isinstance(f, ast.Name):
            try:
                callee = self._name(f.id)
            except _Unknown:
                return
            if inspect.isfunction(callee) and callee.__module__.startswith("engine.formats."):
                self._follow(callee, self.op_type, node)

    def template(self, node: ast.expr | None) -> str:
        """A message argument as the source writes it: literal text; formatted parts as their value when the op
        type fixes it (a helper's bound argument), else as `{expr}`."""
        if node is None:
            return ""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        parts = node.values if isinstance(node, ast.JoinedStr) else [ast.FormattedValue(node, -1, None)]
        out = []
        for p in parts:
            if isinstance(p, ast.Constant):
                out.append(str(p.value))
                continue
            try:
                v = self.value(p.value)
                out.append(v if isinstance(v, str) else "{" + ast.unparse(p.value) + "}")
            except (_Unknown, TypeError, KeyError, IndexError, AttributeError):
                out.append("{" + ast.unparse(p.value) + "}")
        return "".join(out)

    def _call_local(self, local: ast.FunctionDef, node: ast.Call, when: list[str]) -> None:
        if local.name in self.called_locals and self.depth >= MAX_DEPTH:
            return
        self.called_locals.add(local.name)
        saved = dict(self.bound)
        self.bound.update(self._bind([a.arg for a in local.args.args], node))
        self.block(local.body, when)
        self.bound = saved

    def _bind(self, params: list[str], node: ast.Call) -> dict:
        """The call's arguments that the op type fixes, by parameter name."""
        bound = {}
        for name, arg in [*zip(params, node.args, strict=False), *((k.arg, k.value) for k in node.keywords)]:
            try:
                bound[name] = self.value(arg)
            except (_Unknown, TypeError, KeyError, IndexError, AttributeError):
                continue
        return bound

    def _dispatch_target(self, f: ast.Subscript) -> str | None:
        try:
            table, key = self.value(f.value), self.value(f.slice)
        except (_Unknown, TypeError, KeyError):
            return None
        same_table = isinstance(table, dict) and key in self.handlers and table.get(key) is self.handlers[key]
        return key if same_table else None

    def _follow(self, callee: Callable, op_type: str, node: ast.Call) -> None:
        if self.depth >= MAX_DEPTH or (callee, op_type) in self.seen:
            return
        self.seen.add((callee, op_type))
        bound = self._bind([a.arg for a in source_node(callee).args.args], node)
        _Walk(callee, op_type, self.canonical, self.handlers, self.facts, bound, self.depth + 1, self.seen).run()

    def _emitted(self, names: set[str] | None) -> None:
        if names is None:
            self.facts.unresolved = True
            return
        for n in sorted(names):
            if n in self.canonical:
                _add(self.facts.ops, n)

    def _read(self, node: ast.expr) -> None:
        try:
            name = self.value(node)
        except (_Unknown, TypeError, KeyError, IndexError, AttributeError):
            name = self.template(node)
        if isinstance(name, str):
            _add(self.facts.reads, name)

    def _position(self, node: ast.expr) -> None:
        try:
            k = self.value(node)
        except (_Unknown, TypeError, KeyError, IndexError, AttributeError):
            k = None
        if isinstance(k, int):
            self.facts.positions.add(k)
        else:
            self.facts.computed_positions = True


def _conjunction(conditions: list[str]) -> str:
    if not conditions:
        return "always"
    if len(conditions) == 1:
        return conditions[0]
    return " and ".join(f"({c})" if " or " in c else c for c in conditions)


def _compare(op: ast.cmpop, a, b) -> bool:
    table = {ast.Eq: lambda: a == b, ast.NotEq: lambda: a != b, ast.In: lambda: a in b,
             ast.NotIn: lambda: a not in b}
    if type(op) not in table:
        raise _Unknown(type(op).__name__)
    return table[type(op)]()


def _is_params_or_attrs(node: ast.expr) -> bool:
    """`ctx.node.params` / `ctx.node.attrs` (a `.get(name)` on them reads a param or attribute)."""
    return isinstance(node, ast.Attribute) and node.attr in ("params", "attrs") \
        and isinstance(node.value, ast.Attribute) and node.value.attr == "node"


def handler_facts(handler: Callable, op_type: str, canonical: Collection[str],
                  handlers: dict[str, Callable]) -> Facts:
    """What `handler` does with an `op_type` node; `canonical` is the op registry's types, `handlers` the format's
    handler table (for handlers that dispatch to another type's handler)."""
    facts = Facts()
    _Walk(handler, op_type, canonical, handlers, facts).run()
    return facts


def handler_doc(handler: Callable) -> str:
    """The first sentence of the handler's docstring ('' without one)."""
    doc = inspect.getdoc(handler) or ""
    first = doc.split("\n\n")[0].replace("\n", " ")
    return first.split(". ")[0].rstrip(".") if first else ""
