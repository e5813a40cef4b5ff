"""Reference workflows shipped with Railyard; `RAILYARD_WORKFLOWS` defaults to this package."""

from workflows.expense import EXPENSE

__all__ = ["EXPENSE"]
