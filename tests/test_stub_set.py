"""StubSet: stubs followed across loads, unloads and reloads; only a real death counts."""
from tokenrouter_backend.server.stub_set import DIED, RELOADED, UNLOADED, Change, StubSet


def test_loads_reloads_and_unloads_are_followed_and_only_a_death_is_kept():
    stubs = StubSet({10: "heavy", 11: "light"})
    ready = {"heavy": 200, "light": 200}
    status = ready.get
    assert stubs.follow({10: "heavy", 11: "light"}, status) == []
    # a reload: the new heavy stub starts before the old one ends, seen in one look or two
    assert stubs.follow({10: "heavy", 11: "light", 12: "heavy"}, status) == [Change(12, "heavy")]
    assert stubs.follow({11: "light", 12: "heavy"}, status) == [Change(10, "heavy", RELOADED)]
    assert stubs.follow({11: "light", 13: "heavy"}, status) == [Change(13, "heavy"), Change(12, "heavy", RELOADED)]
    # an unload: Triton does not know the model any more
    assert stubs.follow({13: "heavy"}, {"heavy": 200, "light": 400}.get) == [Change(11, "light", UNLOADED)]
    assert not stubs.dead
    # a stub gone while its model is still loaded and nothing replaced it: dead, and it stays so
    assert stubs.follow({}, status) == [Change(13, "heavy", DIED)]
    assert stubs.dead == {13: "heavy"} and stubs.follow({}, status) == [] and stubs.dead == {13: "heavy"}
    assert stubs.names() == {13: "heavy"}


def test_an_older_stub_of_the_model_does_not_excuse_a_newer_ones_death():
    stubs = StubSet({10: "heavy"})
    stubs.follow({10: "heavy", 12: "heavy"}, {"heavy": 200}.get)  # two instances, the second adopted later
    assert stubs.follow({10: "heavy"}, {"heavy": 200}.get) == [Change(12, "heavy", DIED)]
