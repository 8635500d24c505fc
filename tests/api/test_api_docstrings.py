"""Every public entry point of the Python API (what `quantbench` exports, the report's and tables' functions, the
public methods of what they return) documents its parameters and its result as numpydoc sections: a caller reads
`help(quantbench.equiv)`, not the source."""

import inspect
import re

import quantbench
from quantbench.api import equiv as api_equiv
from quantbench.api import tables as api_tables

#: API functions quantbench/__init__.py does not export: the `report` and `tables` commands' (docs/architecture.md)
MORE_FUNCTIONS = (api_equiv.rerender, api_tables.tables_info, api_tables.compact_tables)


def _returned_class(function):
    """The class a function's return annotation names (a string under `from __future__ import annotations`)."""
    annotation = inspect.signature(function).return_annotation
    if isinstance(annotation, str):
        annotation = inspect.getmodule(function).__dict__.get(annotation.strip("'\""))
    return annotation if inspect.isclass(annotation) else None


def entry_points() -> dict:
    """qualified name -> callable: the exported functions and classes, the other API functions, and the public
    methods (properties are attributes, documented in a line) of the classes they return and take."""
    out = {}
    exported = [getattr(quantbench, name) for name in quantbench.__all__]
    for item in [*exported, *MORE_FUNCTIONS]:
        out[f"{item.__module__}.{item.__qualname__}"] = item
    classes = {item for item in exported if inspect.isclass(item)}
    classes |= {c for item in [*exported, *MORE_FUNCTIONS] if inspect.isfunction(item)
                for c in [_returned_class(item)] if c is not None}
    for cls in classes:
        for name, member in vars(cls).items():
            if inspect.isfunction(member) and not name.startswith("_"):
                out[f"{cls.__module__}.{cls.__qualname__}.{name}"] = member
    return out


def _section(doc: str, title: str) -> str | None:
    """The text of a numpydoc section (`title` underlined with dashes), None when absent."""
    match = re.search(rf"^{title}\n-{{{len(title)}}}\n(.*?)(?=^\w[\w ]*\n-+\n|\Z)", doc, re.S | re.M)
    return None if match is None else match.group(1)


def missing_sections(name: str, item) -> list[str]:
    """What `item`'s docstring lacks: a Parameters section naming each parameter (a class: each constructor
    parameter), a Returns section for a function that returns something."""
    doc = inspect.getdoc(item) or ""
    params = [p for p in inspect.signature(item).parameters if p not in ("self", "cls")]
    out = []
    if params:
        listed = _section(doc, "Parameters")
        if listed is None:
            out.append(f"{name}: no Parameters section")
        else:
            named = set(re.findall(r"^\**(\w+)(?: *,|\s*:|$)", listed, re.M))
            named |= {n for line in re.findall(r"^([\w, *]+?)\s*:", listed, re.M) for n in re.findall(r"\w+", line)}
            out += [f"{name}: parameter {p} not in its Parameters section" for p in params if p not in named]
    returns = inspect.signature(item).return_annotation
    if inspect.isfunction(item) and returns not in (None, "None", inspect.Signature.empty) and \
            _section(doc, "Returns") is None:
        out.append(f"{name}: no Returns section")
    if inspect.isfunction(item) and returns is inspect.Signature.empty:
        out.append(f"{name}: no return annotation (-> None when it returns nothing)")
    return out


def test_every_entry_point_documents_its_parameters_and_result():
    found = [m for name, item in sorted(entry_points().items()) for m in missing_sections(name, item)]
    assert found == [], "\n".join(found)


def test_the_check_reads_numpydoc():
    def documented(model, count: int = 2) -> list:
        """Why it exists.

        Parameters
        ----------
        model : str
            Which model.
        count : int
            How many.

        Returns
        -------
        list
            What came of it.
        """

    def undocumented(model, count: int = 2) -> list:
        """Why it exists; `model` and `count` in prose only."""

    assert missing_sections("documented", documented) == []
    assert missing_sections("undocumented", undocumented) == ["undocumented: no Parameters section",
                                                               "undocumented: no Returns section"]
