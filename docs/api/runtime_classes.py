"""A griffe extension (mkdocs.yml): static entries for the two classes built at first access.

``pcp_fn.adapters.vllm.FunctionalPCPManager`` and
``pcp_fn.adapters.vllm_ascend.FunctionalAscendPCPManager`` are made by their package's module
``__getattr__`` over the installed vLLM (and vllm-ascend), so a static reader sees neither. Each
gets an entry here as the class it is at run time: the mixins' docstring (the class's
``__doc__``), the mixins' constructor (its signature) and their public members, in method
resolution order. Nothing is imported; no docstring text is written here.
"""

from __future__ import annotations

from typing import Any

import griffe

# public name -> the mixins it is built from, first base first (vLLM's PCPManager comes last)
RUNTIME_CLASSES = {
    "adapters.vllm.FunctionalPCPManager": ("adapters.vllm.manager.FunctionalPCPManagerMixin",),
    "adapters.vllm_ascend.FunctionalAscendPCPManager": (
        "adapters.vllm_ascend.v2.manager.FunctionalAscendPCPManagerMixin",
        "adapters.vllm.manager.FunctionalPCPManagerMixin",
    ),
}


class RuntimeClasses(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "pcp_fn":
            return
        for public, mixin_paths in RUNTIME_CLASSES.items():
            module_path, name = public.rsplit(".", 1)
            module = pkg[module_path]
            mixins = [pkg[path] for path in mixin_paths]
            first = mixins[0]
            cls = griffe.Class(
                name,
                lineno=first.lineno,
                endlineno=first.endlineno,
                parent=module,
                # the mixins as names their modules resolve (rendered as links), then vLLM's base
                bases=[griffe.ExprName(m.name, parent=m.parent) for m in mixins]
                + ["vllm.v1.worker.gpu.pcp_manager.PCPManager"],
            )
            cls.docstring = griffe.Docstring(
                first.docstring.value,
                lineno=first.docstring.lineno,
                endlineno=first.docstring.endlineno,
                parent=cls,
                parser=first.docstring.parser,
                parser_options=first.docstring.parser_options,
            )
            for mixin in mixins:
                for member_name, member in mixin.members.items():
                    if member_name in cls.members or (
                        member_name.startswith("_") and member_name != "__init__"
                    ):
                        continue
                    cls.set_member(member_name, griffe.Alias(member_name, member, parent=cls))
            module.set_member(name, cls)


class ClassSignatures(griffe.Extension):
    """Signatures for the classes a static reader sees no `__init__` on (griffe synthesizes one for
    `@dataclass` only), so that their entries show how to make one:

    - `@pytree_dataclass` and `NamedTuple` classes: the annotated fields in order, with their
      defaults (a `static_field(...)` or `dataclasses.field(...)` default is its `default=`);
    - a plain class with no `__init__` in its bases (`PartitionLayout`): no argument.

    Protocols and exceptions keep no signature: one is never made, the other takes a message.
    """

    DECORATOR = "pcp_fn.core.pytree.pytree_dataclass"

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name == "pcp_fn":
            self._visit(pkg)

    def _visit(self, obj: griffe.Module | griffe.Class) -> None:
        for member in list(obj.members.values()):
            if member.is_alias:
                continue
            if member.is_class:
                self._visit(member)
                if "__init__" not in member.members:
                    self._add_init(member)
            elif member.is_module:
                self._visit(member)

    def _add_init(self, cls: griffe.Class) -> None:
        decorated = any(
            isinstance(d.value, griffe.Expr) and d.value.canonical_path == self.DECORATOR
            for d in cls.decorators
        )
        if decorated or any(str(base).endswith("NamedTuple") for base in cls.bases):
            if decorated:
                cls.labels.add("dataclass")
            self._set_init(cls, self._fields(cls))
        elif not cls.bases and not any(d for d in cls.decorators):
            self._set_init(cls, [])  # object's constructor: no argument

    @staticmethod
    def _fields(cls: griffe.Class) -> list[griffe.Parameter]:
        fields = []
        for name, member in cls.members.items():
            if member.is_alias or not member.is_attribute or member.annotation is None:
                continue
            if "instance-attribute" not in member.labels:  # a ClassVar is a class attribute only
                continue
            default = member.value
            if isinstance(default, griffe.ExprCall) and str(default.function).endswith(
                ("static_field", "field")
            ):
                keywords = {a.name: a.value for a in default.arguments if isinstance(a, griffe.ExprKeyword)}
                default = keywords.get("default")
            fields.append(
                griffe.Parameter(
                    name,
                    annotation=member.annotation,
                    kind=griffe.ParameterKind.positional_or_keyword,
                    default=default,
                )
            )
        return fields

    @staticmethod
    def _set_init(cls: griffe.Class, fields: list[griffe.Parameter]) -> None:
        init = griffe.Function("__init__", lineno=0, endlineno=0, parent=cls, returns="None")
        init.parameters = griffe.Parameters(
            griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword), *fields
        )
        cls.set_member("__init__", init)
