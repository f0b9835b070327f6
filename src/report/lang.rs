//! The language of the report's human renderings (`--lang`): the table, Markdown, HTML, the
//! workbook and the CSV headers. English is the default, so the same command gives the same
//! bytes on every host; the JSON's keys, the ids and the error messages never change.
//!
//! The English text is the key: a renderer writes `lang.tr("Totals")`, and Japanese comes
//! from the table below. A string with no entry stays English; a unit test checks that every
//! string the renderers pass has one.

/// `--lang`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lang {
    #[default]
    En,
    Ja,
}

impl Lang {
    /// The HTML `lang` attribute.
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Ja => "ja",
        }
    }

    /// A column's header in words (the page's tables): English words, or the Japanese.
    pub fn words(self, column: &'static str) -> &'static str {
        match self {
            Lang::En => EN_WORDS
                .iter()
                .find(|(name, _)| *name == column)
                .map(|(_, words)| *words)
                .unwrap_or(column),
            Lang::Ja => self.tr(column),
        }
    }

    /// `english` in this language.
    pub fn tr(self, english: &'static str) -> &'static str {
        match self {
            Lang::En => english,
            Lang::Ja => JA
                .iter()
                .find(|(en, _)| *en == english)
                .map(|(_, ja)| *ja)
                .unwrap_or(english),
        }
    }
}

/// Column name → its header in English words.
const EN_WORDS: &[(&str, &str)] = &[
    ("campaign_id", "Campaign"),
    ("budget_yen", "Budget (yen)"),
    ("issued_yen", "Issued (yen)"),
    ("overrun_yen", "Over (yen)"),
    ("coupons", "Coupons"),
    ("voided_coupons", "Voided coupons"),
    ("voided_yen", "Voided (yen)"),
    ("redeemed_legacy_duplicates", "Redeemed duplicates"),
    (
        "redeemed_legacy_duplicates_yen",
        "Redeemed duplicates (yen)",
    ),
    ("voided_then_redeemed", "Voided, then redeemed"),
    ("voided_then_redeemed_yen", "Voided, then redeemed (yen)"),
    ("legacy_counter_yen", "Legacy counter (yen)"),
    ("old_system_issued_yen", "Issued by the old system (yen)"),
    ("lost_update_yen", "Lost updates (yen)"),
    ("member_id", "Member"),
    ("month", "Month"),
    ("used_yen", "Used (yen)"),
    ("cap_yen", "Cap (yen)"),
];

/// English → Japanese. Column names are the JSON's field names.
pub(crate) const JA: &[(&str, &str)] = &[
    // Columns.
    ("campaign_id", "キャンペーンID"),
    ("budget_yen", "予算（円）"),
    ("issued_yen", "発行額（円）"),
    ("overrun_yen", "超過額（円）"),
    ("coupons", "クーポン数"),
    ("voided_coupons", "無効化したクーポン数"),
    ("voided_yen", "無効化した額（円）"),
    ("redeemed_legacy_duplicates", "利用済みの重複クーポン数"),
    ("redeemed_legacy_duplicates_yen", "利用済みの重複クーポン額（円）"),
    ("voided_then_redeemed", "無効化後に利用されたクーポン数"),
    ("voided_then_redeemed_yen", "無効化後に利用された額（円）"),
    ("legacy_counter_yen", "旧カウンターの発行額（円）"),
    ("old_system_issued_yen", "旧システムの実際の発行額（円）"),
    ("lost_update_yen", "消失した更新（円）"),
    ("member_id", "会員ID"),
    ("month", "月"),
    ("used_yen", "利用額（円）"),
    ("cap_yen", "月間上限（円）"),
    ("coupon_id", "クーポンID"),
    ("amount_yen", "金額（円）"),
    ("issued_at", "発行日時"),
    ("redeemed_at", "利用日時"),
    ("as_of", "基準日時"),
    ("state", "状態"),
    ("database", "データベース"),
    ("key", "項目"),
    ("value", "値"),
    ("figure", "項目"),
    ("yen", "円"),
    // Headings and facts.
    ("Coupon overrun report", "クーポン超過レポート"),
    ("As of", "基準日時"),
    ("Database", "データベース"),
    ("State", "状態"),
    ("Monthly cap", "月間上限"),
    ("Totals", "合計"),
    ("Campaigns", "キャンペーン"),
    ("Members over the monthly cap", "月間上限を超えた会員"),
    ("(none)", "（なし）"),
    ("(Asia/Tokyo)", "（日本時間）"),
    ("yen per member and month", "円（会員ごと・月ごと）"),
    ("Source", "出典"),
    ("not recorded", "記録なし"),
    (
        "Lost updates: the legacy counter (campaigns.issued_yen) against what the old system issued",
        "消失した更新：旧カウンター（campaigns.issued_yen）と旧システムが実際に発行した額",
    ),
    // Totals.
    ("Campaign overruns (yen)", "キャンペーン予算の超過額（円）"),
    ("Member overruns past the monthly cap (yen)", "会員の月間上限の超過額（円）"),
    ("Voided by the repair (yen)", "修復で無効化した額（円）"),
    ("Redeemed legacy duplicates: money lost (yen)", "利用済みの重複クーポン：損失額（円）"),
    (
        "Voided, then redeemed anyway by the old cart (yen)",
        "無効化後に旧カートで利用された額（円）",
    ),
    (
        "Lost updates: issued by the old system, missing from its counter (yen)",
        "消失した更新：旧システムが発行したのにカウンターにない額（円）",
    ),
    // States.
    (
        "legacy: nothing is repaired yet; duplicates are counted by the release's ranking rule and still count as issued",
        "legacy：まだ何も修復されていません。重複はリリースの順位付けで数え、発行済みに含めています",
    ),
    (
        "partial: the release has started but is not finished; figures are as the data stands now",
        "partial：リリースは始まっていますが、終わっていません。数値は現時点のデータです",
    ),
    (
        "released: duplicates are voided, the unique index and the budget check are in place",
        "released：重複は無効化済みで、一意インデックスと予算チェックが有効です",
    ),
    // Where the lost updates come from.
    (
        "live: the release has not passed the deploy gate; the counter and the coupons as they are now",
        "現在値：リリースはデプロイのゲートを通過していません。カウンターとクーポンの現在の値です",
    ),
    (
        "recorded when the release passed the deploy gate",
        "リリースがデプロイのゲートを通過したときの記録",
    ),
    (
        "not recorded: the deploy gate was passed by a pgmend that did not record the legacy counter",
        "記録なし：デプロイのゲートは、旧カウンターを記録しない版の pgmend で通過されました",
    ),
    // The page and the workbook.
    ("Budget versus issued, per campaign", "キャンペーンごとの予算と発行額"),
    ("Budget against issued, per campaign (yen)", "キャンペーンごとの予算と発行額（円）"),
    ("budget", "予算"),
    ("issued", "発行額"),
    ("issued, over budget", "発行額（予算超過）"),
    (
        "Distribution of member overruns past the monthly cap",
        "会員の月間上限超過額の分布",
    ),
    ("No member is over the monthly cap.", "月間上限を超えた会員はいません。"),
    (
        "Member-months per overrun range, in yen past the cap.",
        "超過額（上限を超えた円）の範囲ごとの会員・月の数",
    ),
];

#[cfg(test)]
mod tests {
    use super::{Lang, JA};

    #[test]
    fn english_is_the_key_and_japanese_is_looked_up() {
        assert_eq!(Lang::En.tr("Totals"), "Totals");
        assert_eq!(Lang::Ja.tr("Totals"), "合計");
        assert_eq!(Lang::Ja.tr("budget_yen"), "予算（円）");
        let mut keys: Vec<&str> = JA.iter().map(|(en, _)| *en).collect();
        keys.sort();
        let before = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), before, "each English string once");
    }
}
