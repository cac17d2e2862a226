"""medomni-harbor: the Harbor runner plug-in."""
