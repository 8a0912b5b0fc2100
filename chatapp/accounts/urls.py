from django.contrib.auth import views as auth_views
from django.urls import path

from chatapp.accounts import views
from chatapp.accounts.login_throttle import ThrottledAuthenticationForm

urlpatterns = [
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(authentication_form=ThrottledAuthenticationForm),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/signup/", views.signup, name="signup"),
]
