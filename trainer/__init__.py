"""freshper.trainer. Imported by its bare name from the checkout's root, the folder hands that name
to an installed distribution of it, if any, and is otherwise empty (freshper/_checkout.py)."""
if __name__ == "trainer":
    from freshper._checkout import defer_to_installed

    defer_to_installed(__name__)
    del defer_to_installed
