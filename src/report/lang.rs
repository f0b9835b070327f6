//! The language of the report's human renderings (`--lang`): the table, Markdown, HTML, the
//! workbook and the CSV headers. English is the default, so the same command gives the same
//! bytes on every host; the JSON's keys, the ids and the error messages never change.
//!
//! The English text is the key: a renderer writes `lang.tr("Totals")`, and Japanese comes
//! from the tables below. A string with no entry stays English; a unit test checks that every
//! string the renderers pass has one.
//!
//! Japanese has no spaces, so a browser may wrap a header anywhere (`キャン/ペーン/ID`). Each
//! Japanese column header is therefore written as its words (`col!`): `tr` gives the whole
//! header, `words_of` the words, which the page joins with `<wbr>` and wraps only there.

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
            Lang::Ja => JA_COLUMNS
                .iter()
                .find(|(en, _, _)| *en == english)
                .map(|(_, ja, _)| *ja)
                .or_else(|| JA.iter().find(|(en, _)| *en == english).map(|(_, ja)| *ja))
                .unwrap_or(english),
        }
    }

    /// A column's header in words (as [`Lang::words`]), cut where a line may wrap: at the
    /// spaces in English, between the words of the Japanese.
    pub fn words_of(self, column: &'static str) -> Vec<&'static str> {
        match self {
            Lang::En => self.words(column).split_inclusive(' ').collect(),
            Lang::Ja => JA_COLUMNS
                .iter()
                .find(|(en, _, _)| *en == column)
                .map(|(_, _, words)| words.to_vec())
                .unwrap_or_else(|| vec![self.tr(column)]),
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
    ("coupon_id", "Coupon"),
    ("amount_yen", "Amount (yen)"),
    ("issued_at", "Issued at (Asia/Tokyo)"),
    ("redeemed_at", "Redeemed at (Asia/Tokyo)"),
];

/// A Japanese column header from its words: (column, the whole header, the words).
macro_rules! col {
    ($column:literal, $($word:literal),+) => {
        ($column, concat!($($word),+), &[$($word),+])
    };
}

/// Column name → its Japanese header, and the words it may wrap between.
const JA_COLUMNS: &[(&str, &str, &[&str])] = &[
    col!("campaign_id", "キャンペーン", "ID"),
    col!("budget_yen", "予算", "（円）"),
    col!("issued_yen", "発行額", "（円）"),
    col!("overrun_yen", "超過額", "（円）"),
    col!("coupons", "クーポン数"),
    col!("voided_coupons", "無効化した", "クーポン数"),
    col!("voided_yen", "無効化した", "額", "（円）"),
    col!(
        "redeemed_legacy_duplicates",
        "利用済みの",
        "重複",
        "クーポン数"
    ),
    col!(
        "redeemed_legacy_duplicates_yen",
        "利用済みの",
        "重複",
        "クーポン額",
        "（円）"
    ),
    col!(
        "voided_then_redeemed",
        "無効化後に",
        "利用された",
        "クーポン数"
    ),
    col!(
        "voided_then_redeemed_yen",
        "無効化後に",
        "利用された",
        "額",
        "（円）"
    ),
    col!("legacy_counter_yen", "旧カウンターの", "発行額", "（円）"),
    col!(
        "old_system_issued_yen",
        "旧システムの",
        "実際の",
        "発行額",
        "（円）"
    ),
    col!("lost_update_yen", "消失した", "更新", "（円）"),
    col!("member_id", "会員", "ID"),
    col!("month", "月"),
    col!("used_yen", "利用額", "（円）"),
    col!("cap_yen", "月間上限", "（円）"),
    col!("coupon_id", "クーポン", "ID"),
    col!("amount_yen", "金額", "（円）"),
    col!("issued_at", "発行日時", "（日本時間）"),
    col!("redeemed_at", "利用日時", "（日本時間）"),
];

/// English → Japanese. Column names are the JSON's field names.
pub(crate) const JA: &[(&str, &str)] = &[
    // Columns of the CSV's summary.
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
        "修復前：まだ何も修復されていません。重複はリリースの順位付けで数え、発行済みに含めています",
    ),
    (
        "partial: the release has started but is not finished; figures are as the data stands now",
        "リリース途中：リリースは始まっていますが、終わっていません。数値は現時点のデータです",
    ),
    (
        "released: duplicates are voided, the unique index and the budget check are in place",
        "リリース済み：重複は無効化済みで、一意インデックスと予算チェックが有効です",
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
    // The state, in one word.
    ("legacy", "修復前"),
    ("partial", "リリース途中"),
    ("released", "リリース済み"),
    // The workbook: sheet names and the summary.
    ("Summary", "概要"),
    ("Member-months over cap", "月間上限を超えた会員・月"),
    ("Redeemed duplicates", "利用済みの重複クーポン"),
    ("Figure", "項目"),
    ("Value", "値"),
    ("What it means", "説明"),
    ("As of (Asia/Tokyo)", "基準日時（日本時間）"),
    (
        "Every figure is from one read-only snapshot of the database at this time.",
        "すべての数値は、この時点のデータベースの読み取り専用スナップショット 1 つから取っています。",
    ),
    (
        "Where the figures were read: host, port and database name.",
        "数値を読んだ場所：ホスト、ポート、データベース名。",
    ),
    ("Lost updates: source", "消失した更新：出典"),
    ("live", "現在値"),
    ("recorded at the deploy gate", "デプロイのゲートで記録"),
    ("Monthly cap (yen)", "月間上限（円）"),
    (
        "The most a member may receive in coupons in one month.",
        "会員 1 人が 1 か月に受け取れるクーポンの上限額。",
    ),
    ("Continued on more sheets", "複数シートに分割"),
    (
        "Issued past each campaign's budget, over the campaigns that passed it.",
        "予算を超えたキャンペーンの、予算を超えて発行した額の合計。",
    ),
    (
        "Coupons past the monthly cap, over the member-months that passed it.",
        "月間上限を超えた会員・月の、上限を超えたクーポン額の合計。",
    ),
    (
        "Duplicate coupons the repair voided: taken back before use.",
        "修復で無効化した重複クーポン：利用前に取り消した額。",
    ),
    (
        "Duplicates already redeemed, so kept as history: money lost.",
        "すでに利用された重複クーポン（履歴として残す）：損失額。",
    ),
    (
        "Voided coupons the old cart redeemed anyway; part of the voided amount.",
        "無効化後に旧カートで利用されたクーポン。無効化した額の内数。",
    ),
    ("Budgets, all campaigns (yen)", "全キャンペーンの予算（円）"),
    ("The campaigns' budgets added up.", "キャンペーンの予算の合計。"),
    ("Issued, all campaigns (yen)", "全キャンペーンの発行額（円）"),
    ("Coupons that are not voided, added up.", "無効化されていないクーポンの額の合計。"),
    ("Coupons not voided", "有効なクーポン数"),
    ("How many coupons stand, all campaigns.", "全キャンペーンの有効なクーポンの数。"),
    ("Voided coupons", "無効化したクーポン数"),
    ("How many coupons the repair voided.", "修復で無効化したクーポンの数。"),
    ("Redeemed duplicates (coupons)", "利用済みの重複クーポン数"),
    ("How many duplicates were already redeemed.", "すでに利用された重複クーポンの数。"),
    ("Voided, then redeemed (coupons)", "無効化後に利用されたクーポン数"),
    ("How many voided coupons were redeemed anyway.", "無効化後に利用されたクーポンの数。"),
    ("Member-months over the cap", "月間上限を超えた会員・月の数"),
    (
        "Members and months whose coupons pass the monthly cap.",
        "クーポンの合計が月間上限を超えた会員と月の組。",
    ),
    ("Used in those member-months (yen)", "その会員・月の利用額（円）"),
    (
        "All the coupons of the member-months over the cap.",
        "月間上限を超えた会員・月のクーポン額の合計。",
    ),
    ("Legacy counter (yen)", "旧カウンターの発行額（円）"),
    (
        "What the old system's counter said it had issued.",
        "旧システムのカウンターが示していた発行額。",
    ),
    ("Issued by the old system (yen)", "旧システムの実際の発行額（円）"),
    (
        "What the old system really issued, voided coupons included.",
        "旧システムが実際に発行した額（無効化したクーポンを含む）。",
    ),
    ("Lost updates (yen)", "消失した更新（円）"),
    (
        "Issued, yet missing from the counter: updates lost to double taps.",
        "発行したのにカウンターにない額：二重タップで消えた更新。",
    ),
    // The page's note on the members it does not list.
    (
        "The complete list is in the report's workbook (.xlsx) and CSV files.",
        "全件はレポートのワークブック（.xlsx）と CSV ファイルにあります。",
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
        assert_eq!(
            Lang::Ja.tr("voided_then_redeemed_yen"),
            "無効化後に利用された額（円）"
        );
        assert_eq!(
            Lang::Ja.words_of("campaign_id"),
            ["キャンペーン", "ID"],
            "a Japanese header wraps between its words"
        );
        assert_eq!(Lang::En.words_of("budget_yen"), ["Budget ", "(yen)"]);
        let mut keys: Vec<&str> = JA
            .iter()
            .map(|(en, _)| *en)
            .chain(super::JA_COLUMNS.iter().map(|(column, _, _)| *column))
            .collect();
        keys.sort();
        let before = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), before, "each English string once");
    }
}
