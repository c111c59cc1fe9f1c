"""Columns read as tuples on demand (``LazyTuple``: a schedule's actions, a simulation's
events): nothing is made until an item is read, and then they behave as the tuple."""

from __future__ import annotations

import copy
import pickle

import numpy as np

from outcore.lazytuple import LazyTuple
from outcore.schedule.ir import Action, ActionColumns, action_columns


def test_items_are_made_once_and_only_when_read():
    made = []

    def make():
        made.append(1)
        return (1, 2, 3)

    lazy = LazyTuple(3, make)
    assert len(lazy) == 3 and not made  # the length needs no items
    assert lazy == (1, 2, 3) and lazy == [1, 2, 3] and lazy != (1, 2) and lazy != "123"
    assert lazy[1:] == (2, 3) and list(lazy) == [1, 2, 3] and lazy + [4] == (1, 2, 3, 4)
    assert made == [1]
    assert pickle.loads(pickle.dumps(lazy)) == (1, 2, 3)
    assert type(copy.deepcopy(lazy)) is tuple
    assert repr(lazy) == "LazyTuple(3 items)"


def test_action_columns_are_the_actions_they_stand_for():
    acts = (Action("RF", mb=1, transfer=4), Action("F", mb=1, piece=2),
            Action("SB", mb=0, transfer=3), Action("AR", bucket=1), Action("OPT"))
    cols = ActionColumns(*action_columns(acts))
    assert cols == acts and tuple(cols) == acts and [str(a) for a in cols] == \
        ["t4RF1", "2F1", "t3SB0", "AR1", "OPT"]
    assert all(np.array_equal(a, b) for a, b in zip(action_columns(cols), cols.columns))
    assert pickle.loads(pickle.dumps(cols)) == acts
