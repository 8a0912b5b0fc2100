from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "chatapp.accounts"
    label = "accounts"
    verbose_name = "Accounts"
