//! `pgmend report overruns`: opens one REPEATABLE READ, READ ONLY snapshot, streams the
//! report into stdout or into temporary files that are renamed over `--output` at the end
//! (one file per CSV section).
//!
//! The format comes from `--format`, else from `--output`'s extension (`format_for`; a
//! contradiction is refused); a bad `--output` (existing without `--force`, a directory, a missing
//! parent) is refused before connecting (`check_target`). The renderer writes to stdout or to a
//! `tempfile` beside the target, synced and renamed into place (`persist_noclobber` unless
//! `--force`) only after the last row; CSV gets one temporary file per section, or stdout for
//! `--section`. `member_limit`: by default the table lists 20 members on a terminal and the page
//! 200.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{open_to_read, parent, snapshot, temporary_beside};
use crate::cli::{CsvSection, Format, Limit, OverrunsArgs, ReportLang};
use crate::error::{Outcome, PgContext};
use crate::report::{
    self, Csv, Database, Html, Json, Lang, Render, Section, Summary, Text, TextStyle, Xlsx,
};

pub fn overruns(args: &OverrunsArgs, given: Option<Format>) -> Result<Outcome> {
    let format = format_for(args.output.as_deref(), given)?;
    if args.excel && format != Format::Csv {
        bail!("--excel only applies to --format csv (it adds the byte order mark Excel needs)");
    }
    if args.members.is_some() && matches!(format, Format::Json | Format::Csv | Format::Xlsx) {
        bail!(
            "--members only applies to the table, Markdown and HTML; --format {} always holds every row",
            format.name()
        );
    }
    if format == Format::Xlsx && args.output.is_none() {
        bail!("--format xlsx writes a workbook, not text: give --output FILE.xlsx");
    }
    let targets = targets(args, format)?;
    for (path, _) in &targets {
        if let Some(path) = path {
            check_target(path, args.force)?;
        }
    }
    refuse_another_release(args)?;
    let tables: Vec<String> = crate::report::TABLES
        .iter()
        .map(|t| t.to_string())
        .collect();
    let (mut session, _) = open_to_read(&args.conn, "report overruns", &tables)?;
    let database = Database::from_params(&session.params);
    let mut tx = snapshot(&mut session.client)?;

    if targets[0].0.is_none() {
        let stdout = BufWriter::new(crate::output::stdout());
        write(
            &mut tx,
            database,
            args,
            format,
            vec![(targets[0].1, stdout)],
        )?;
    } else {
        write_files(&mut tx, database, args, format, &targets)?;
    }
    tx.rollback().doing("closing the snapshot")?;
    Ok(Outcome::Done)
}

/// Writes the report into a temporary file beside each target, then renames them into place
/// (all after the last row), and says what it wrote.
fn write_files(
    tx: &mut postgres::Transaction<'_>,
    database: Database,
    args: &OverrunsArgs,
    format: Format,
    targets: &[(Option<PathBuf>, Section)],
) -> Result<()> {
    let mut files = Vec::new();
    for (path, section) in targets {
        let path = path.as_deref().expect("every target is a file");
        files.push((temporary_beside(path)?, *section));
    }
    let summary = if format == Format::Xlsx {
        let mut book = Xlsx::new(BufWriter::new(files[0].0.as_file()), lang(args));
        report::generate(tx, database, args.monthly_cap_yen, &mut book)?
    } else {
        write(
            tx,
            database,
            args,
            format,
            files
                .iter()
                .map(|(file, section)| (*section, BufWriter::new(file.as_file())))
                .collect(),
        )?
    };
    for (file, _) in &files {
        file.as_file()
            .sync_all()
            .with_context(|| format!("cannot flush the report to {}", file.path().display()))?;
    }
    let mut written = Vec::new();
    for ((file, _), (path, _)) in files.into_iter().zip(targets) {
        let path = path.as_deref().expect("every target is a file");
        let result = if args.force {
            file.persist(path).map(|_| ())
        } else {
            file.persist_noclobber(path).map(|_| ())
        };
        result.map_err(|e| e.error).with_context(|| {
            format!(
                "cannot write {} (nothing was written there); it may have been created meanwhile: pass --force to replace it",
                path.display()
            )
        })?;
        written.push(path.display().to_string());
    }
    crate::say!(
        "pgmend: wrote {} (state {}; {}, campaign overruns {}; {} over the cap, {})",
        written.join(", "),
        summary.state.as_str(),
        crate::human::count(summary.campaigns as i64, "campaign"),
        crate::human::yen(summary.totals.campaign_overrun_yen),
        crate::human::count(summary.totals.members_over_monthly_cap, "member-month"),
        crate::human::yen(summary.totals.member_overrun_yen),
    );
    Ok(())
}

/// Where each part of the report goes (None: stdout), and for CSV which section it holds.
/// A CSV holds one section: `--section` names it, or `--output NAME.csv` becomes one file per
/// section beside it (NAME-summary.csv, ...), all from the same snapshot.
fn targets(args: &OverrunsArgs, format: Format) -> Result<Vec<(Option<PathBuf>, Section)>> {
    if format != Format::Csv {
        if args.section.is_some() {
            bail!("--section only applies to --format csv; the other formats hold every section");
        }
        return Ok(vec![(args.output.clone(), Section::Summary)]);
    }
    let section = args.section.map(|s| match s {
        CsvSection::Summary => Section::Summary,
        CsvSection::Campaigns => Section::Campaigns,
        CsvSection::Members => Section::Members,
    });
    Ok(match (&args.output, section) {
        (output, Some(section)) => vec![(output.clone(), section)],
        (None, None) => bail!(
            "a CSV holds one section, so that summing a column never adds totals to rows: pass --section summary, campaigns or members, or --output NAME.csv to write NAME-summary.csv, NAME-campaigns.csv and NAME-members.csv from one snapshot"
        ),
        (Some(path), None) => Section::ALL
            .iter()
            .map(|s| (Some(section_path(path, *s)), *s))
            .collect(),
    })
}

/// `dir/overruns.csv` and `members` → `dir/overruns-members.csv`.
fn section_path(path: &Path, section: Section) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!("{stem}-{}{ext}", section.name()))
}

fn write<W: Write>(
    tx: &mut postgres::Transaction<'_>,
    database: Database,
    args: &OverrunsArgs,
    format: Format,
    mut outs: Vec<(Section, W)>,
) -> Result<Summary> {
    let limit = member_limit(args, format);
    let mut renderer: Box<dyn Render + '_> = if format == Format::Csv {
        Box::new(Csv::new(outs, args.excel, lang(args))?)
    } else {
        let out = outs.pop().expect("one output").1;
        match format {
            Format::Human => {
                Box::new(Text::new(out, TextStyle::Table, lang(args)).with_member_limit(limit))
            }
            Format::Markdown => {
                Box::new(Text::new(out, TextStyle::Markdown, lang(args)).with_member_limit(limit))
            }
            Format::Json => Box::new(Json::new(out)),
            Format::Html => Box::new(Html::new(out, lang(args)).with_member_limit(limit)),
            Format::Csv => unreachable!("handled above"),
            Format::Xlsx => unreachable!("written to a file by its own renderer"),
            Format::Openmetrics => unreachable!("refused for the report by main"),
        }
    };
    report::generate(tx, database, args.monthly_cap_yen, renderer.as_mut())
}

/// Terminal rows shown before the list is cut, and rows on the HTML page, by default.
const TERMINAL_MEMBERS: u64 = 20;
const PAGE_MEMBERS: u64 = 200;

/// How many member rows the rendering lists: `--members`, else the first few on a terminal
/// (so the totals do not scroll away) and on the page, else every row.
fn member_limit(args: &OverrunsArgs, format: Format) -> Option<u64> {
    use std::io::IsTerminal;
    match (args.members, format) {
        (Some(Limit::All), _) => None,
        (Some(Limit::First(n)), _) => Some(n),
        (None, Format::Human) if args.output.is_none() && std::io::stdout().is_terminal() => {
            Some(TERMINAL_MEMBERS)
        }
        (None, Format::Html) => Some(PAGE_MEMBERS),
        (None, _) => None,
    }
}

fn lang(args: &OverrunsArgs) -> Lang {
    match args.lang {
        ReportLang::En => Lang::En,
        ReportLang::Ja => Lang::Ja,
    }
}

/// The format: `--format`, else the one `--output`'s extension names (`.csv`, `.json`,
/// `.md`, `.html`, `.xlsx`), else the table (`.txt`, or no extension). An extension pgmend does
/// not write (`.xls`, `.pdf`) is refused, naming the ones it writes. A `--format` that
/// contradicts the extension is refused:
/// `--output r.csv --format json` would write JSON into a file that spreadsheets open as CSV.
fn format_for(output: Option<&Path>, given: Option<Format>) -> Result<Format> {
    let extension = output
        .and_then(|p| p.extension())
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let named = match extension.as_deref() {
        None | Some("txt" | "text") => None,
        Some("csv") => Some(Format::Csv),
        Some("json") => Some(Format::Json),
        Some("md" | "markdown") => Some(Format::Markdown),
        Some("html" | "htm") => Some(Format::Html),
        Some("xlsx") => Some(Format::Xlsx),
        // A text table in `overruns.xls` or `.pdf` would open as garbage, or not at all.
        Some(other) => bail!(
            "--output {}: pgmend does not write .{other} files; it writes .txt (the table), .csv, .json, .md (Markdown), .html and .xlsx (an Excel workbook). Name the file with one of those{}",
            output.map(|p| p.display().to_string()).unwrap_or_default(),
            if other.starts_with("xl") || other == "ods" {
                ": for a spreadsheet, --output overruns.xlsx"
            } else {
                ""
            }
        ),
    };
    match (given, named) {
        (Some(given), Some(named)) if given != named => bail!(
            "--output {} names a {} file, but --format {} was given; leave --format out (the extension decides) or make them agree",
            output.map(|p| p.display().to_string()).unwrap_or_default(),
            named.name(),
            given.name(),
        ),
        (Some(given), _) => Ok(given),
        (None, named) => Ok(named.unwrap_or(Format::Human)),
    }
}

/// Refuses before connecting: an existing file without `--force`, a directory, or a
/// missing parent directory.
fn check_target(path: &Path, force: bool) -> Result<()> {
    if path.is_dir() {
        bail!("--output {} is a directory; name a file", path.display());
    }
    if path.exists() && !force {
        bail!(
            "--output {} already exists; pass --force to replace it, or choose another name",
            path.display()
        );
    }
    let dir = parent(path);
    if !dir.is_dir() {
        bail!(
            "--output {}: the directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

/// `report overruns` is the coupon release's: under another release (`--release` or the
/// current directory) it refuses, before connecting, rather than report another incident's
/// database with the coupon incident's figures.
fn refuse_another_release(args: &OverrunsArgs) -> Result<()> {
    if let Some(name) = super::release_name(&args.release)? {
        if name != crate::release::COUPON_RELEASE {
            bail!(
                "`pgmend report overruns` reports what the coupon incident cost and belongs to the coupon release ({}); the release chosen here is {name} (--release, PGMEND_RELEASE or the current directory). Run it without --release from a directory that holds no other release, or from the coupon release's directory; nothing was read",
                crate::release::COUPON_RELEASE
            );
        }
    }
    Ok(())
}
