//! Tenants' shares while planning: what each tenant's unfinished tranches hold of a
//! provider's enqueued-token budgets and of an account's files, the caps on them, and which
//! tenant's turn comes first (the one holding least), so that one tenant's huge job cannot
//! starve another's.

use std::collections::HashMap;

use tranche_core::AccountId;
use tranche_store::TenantLoad;

/// The caps a tenant's next tranche must stay within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// The most enqueued tokens of the tranche's model the tenant may hold.
    pub tokens: Option<u64>,
    /// The most unfinished tranches the tenant may have on the account, when its provider
    /// takes input as files (`None` otherwise).
    pub files: Option<u64>,
}

/// What each tenant holds of one provider, read once per planning pass and kept up to date
/// as tranches are claimed.
#[derive(Debug, Default)]
pub(crate) struct Shares {
    /// Enqueued tokens by tenant and model, over the provider's accounts (as budgets are).
    tokens: HashMap<(Option<String>, String), u64>,
    /// Unfinished tranches by tenant and account.
    tranches: HashMap<(Option<String>, Option<AccountId>), u64>,
}

impl Shares {
    pub(crate) fn new(loads: Vec<TenantLoad>) -> Self {
        let mut shares = Self::default();
        for load in loads {
            *shares.tokens.entry((load.tenant.clone(), load.model)).or_default() +=
                load.enqueued_tokens;
            *shares.tranches.entry((load.tenant, load.account)).or_default() += load.live_tranches;
        }
        shares
    }

    /// The enqueued tokens of `model` the tenant's tranches hold.
    pub(crate) fn tokens(&self, tenant: Option<&str>, model: &str) -> u64 {
        self.tokens.get(&(tenant.map(str::to_owned), model.to_owned())).copied().unwrap_or(0)
    }

    /// The tenant's unfinished tranches on `account`.
    fn tranches(&self, tenant: Option<&str>, account: &AccountId) -> u64 {
        self.tranches.get(&(tenant.map(str::to_owned), Some(account.clone()))).copied().unwrap_or(0)
    }

    /// Whether the tenant may have one more tranche of `est_tokens` tokens of `model` on
    /// `account`. A tenant holding nothing is always admitted, or a tranche larger than the
    /// cap would never go out.
    pub(crate) fn admits(
        &self,
        tenant: Option<&str>,
        (model, account): (&str, &AccountId),
        est_tokens: u64,
        caps: Caps,
    ) -> bool {
        !self.files_full(tenant, account, caps.files)
            && crate::policy::admits(self.tokens(tenant, model), est_tokens, caps.tokens)
    }

    /// Whether the tenant has its most unfinished tranches on `account` already (then its
    /// waiting requests need not even be read this round).
    pub(crate) fn files_full(
        &self,
        tenant: Option<&str>,
        account: &AccountId,
        max_files: Option<u64>,
    ) -> bool {
        max_files.is_some_and(|max| self.tranches(tenant, account) >= max)
    }

    /// Counts a tranche just claimed.
    pub(crate) fn add(
        &mut self,
        tenant: Option<&str>,
        (model, account): (&str, &AccountId),
        est_tokens: u64,
    ) {
        let tenant = tenant.map(str::to_owned);
        *self.tokens.entry((tenant.clone(), model.to_owned())).or_default() += est_tokens;
        *self.tranches.entry((tenant, Some(account.clone()))).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use tranche_core::ProviderKind;

    use super::*;

    fn account(n: u8) -> AccountId {
        AccountId::new(ProviderKind::Openai, &format!("http://127.0.0.{n}/v1"))
    }

    fn load(tenant: Option<&str>, n: u8, tokens: u64, tranches: u64) -> TenantLoad {
        TenantLoad {
            tenant: tenant.map(str::to_owned),
            account: Some(account(n)),
            model: "m".into(),
            enqueued_tokens: tokens,
            live_tranches: tranches,
        }
    }

    #[test]
    fn tokens_are_capped_per_tenant_and_model_across_accounts() {
        let shares = Shares::new(vec![load(Some("a"), 1, 60, 1), load(Some("a"), 2, 30, 1)]);
        let caps = Caps { tokens: Some(100), files: None };
        assert_eq!(shares.tokens(Some("a"), "m"), 90);
        assert!(shares.admits(Some("a"), ("m", &account(1)), 10, caps));
        assert!(!shares.admits(Some("a"), ("m", &account(1)), 11, caps));
        assert!(shares.admits(Some("a"), ("other", &account(1)), 100, caps), "per model");
        assert!(shares.admits(Some("b"), ("m", &account(1)), 100, caps), "per tenant");
        assert!(shares.admits(None, ("m", &account(1)), 500, caps), "alone, even when larger");
    }

    #[test]
    fn files_are_capped_per_tenant_and_account_and_claims_count() {
        let mut shares = Shares::new(vec![load(None, 1, 0, 2)]);
        let caps = Caps { tokens: None, files: Some(3) };
        assert!(shares.admits(None, ("m", &account(1)), 1, caps));
        shares.add(None, ("m", &account(1)), 5);
        assert!(!shares.admits(None, ("m", &account(1)), 1, caps), "three unfinished");
        assert!(shares.admits(None, ("m", &account(2)), 1, caps), "another account");
        assert!(shares.admits(Some("a"), ("m", &account(1)), 1, caps), "another tenant");
        assert_eq!(shares.tokens(None, "m"), 5);
        let uncapped = Caps { tokens: None, files: None };
        assert!(shares.admits(None, ("m", &account(1)), 1, uncapped));
    }
}
