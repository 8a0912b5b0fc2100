from django.contrib import admin

from chatapp.accounts.login_throttle import ThrottledAdminAuthenticationForm

# The admin's log-in is throttled like the site's (login_throttle.py).
admin.site.login_form = ThrottledAdminAuthenticationForm
