"""`railyard serve`: the HTTP API and the back-office pages over one `Engine`."""
