"""The registry: every workflow version the running code defines, side by side.

New tasks start on the newest version unless one is named; a stored task is
resolved to exactly the version it is pinned to, and its digest must match.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Iterator, Sequence

from engine.core.definition import Workflow
from engine.core.errors import Code, DefinitionError, RailyardError, Refused
from engine.core.text import closest
from engine.runtime import config


class Registry:
    """Workflow definitions by name and version."""

    def __init__(self, workflows: Iterable[Workflow] = ()) -> None:
        self._by_name: dict[str, dict[int, Workflow]] = {}
        for wf in workflows:
            self.register(wf)

    def register(self, workflow: Workflow) -> Workflow:
        """Add `workflow`; the same object twice is harmless, two different contents under one ref are not."""
        versions = self._by_name.setdefault(workflow.name, {})
        existing = versions.get(workflow.version)
        if existing is not None and existing.digest != workflow.digest:
            raise DefinitionError(workflow.ref, [f"two different definitions claim {workflow.ref} (digests differ)"])
        versions[workflow.version] = workflow
        return workflow

    def get(self, name: str, version: int | None = None) -> Workflow:
        """The named version, or the newest; refuses with WORKFLOW_UNKNOWN / VERSION_UNKNOWN."""
        versions = self._by_name.get(name)
        if not versions and not self._by_name:
            raise Refused(
                f"no workflow named {name!r}: the registry is empty; set RAILYARD_WORKFLOWS to the modules that "
                f"define your workflows (unset, only a `{config.DEFAULT_WORKFLOWS_PACKAGE}` package the process "
                "can import is loaded)",
                code=Code.WORKFLOW_UNKNOWN,
                workflow=name,
            )
        if not versions:
            known = sorted(self._by_name)
            close = closest(name, known)
            guess = f" (did you mean {close}?)" if close else ""
            listed = known[0] if len(known) == 1 else ", ".join(known[:-1]) + " and " + known[-1]
            raise Refused(
                f"no workflow named {name!r}{guess}; the known ones are {listed}",
                code=Code.WORKFLOW_UNKNOWN,
                workflow=name,
                known=known,
            )
        if version is None:
            return versions[max(versions)]
        found = versions.get(version)
        if found is None:
            raise Refused(
                f"workflow {name!r} has no version {version}; known: {sorted(versions)}",
                code=Code.VERSION_UNKNOWN,
                workflow=name,
                version=version,
                known=sorted(versions),
            )
        return found

    def find(self, name: str, version: int) -> Workflow | None:
        return self._by_name.get(name, {}).get(version)

    def versions(self, name: str) -> list[int]:
        return sorted(self._by_name.get(name, {}))

    def __iter__(self) -> Iterator[Workflow]:
        for name in sorted(self._by_name):
            for version in sorted(self._by_name[name]):
                yield self._by_name[name][version]

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_name.values())

    @classmethod
    def from_modules(cls, modules: Sequence[str]) -> Registry:
        """Import each module and register every `Workflow` it defines at module level."""
        registry = cls()
        for module_name in modules:
            try:
                module = importlib.import_module(module_name)
            except RailyardError:
                raise  # e.g. a DefinitionError raised while the module built its workflows
            except Exception as exc:  # any import failure is a configuration problem
                # A syntax error or a failing import in a user's module is reported, not a traceback.
                raise RailyardError(
                    f"cannot import workflow module {module_name!r}: {type(exc).__name__}: {exc}",
                    code=Code.CONFIG_INVALID,
                    module=module_name,
                ) from None
            for value in vars(module).values():
                candidates = value if isinstance(value, list | tuple) else (value,)
                for candidate in candidates:
                    if isinstance(candidate, Workflow):
                        registry.register(candidate)
        return registry

    @classmethod
    def from_env(cls) -> Registry:
        """The registry of the modules RAILYARD_WORKFLOWS names.

        Unset, it is the user's own `workflows` package if the process can import one (the CLI looks in its
        working directory first), and empty if there is none: Railyard installs no workflows of its own.
        """
        named = config.workflow_modules()
        if named:
            return cls.from_modules(named)
        if importlib.util.find_spec(config.DEFAULT_WORKFLOWS_PACKAGE) is None:
            return cls()
        return cls.from_modules([config.DEFAULT_WORKFLOWS_PACKAGE])
