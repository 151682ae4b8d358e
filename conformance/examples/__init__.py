"""A small example framework (``minirl``) and its Conduit adapter, kept in the repo so the
scaffold (``conduit new-adapter``) and the documentation have a real target."""
