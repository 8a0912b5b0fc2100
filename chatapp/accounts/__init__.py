"""Accounts: sign-up, the throttled log-in (site and admin), the first admin account."""
