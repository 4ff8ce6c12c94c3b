//! Exact windows, with instants computed outside (`date -u -d ... +%s`, and `zdump -v` of
//! tzdata 2025b for the transitions) and indexes by hand; and properties over random instants
//! and zones.

use super::{Calendar, CalendarWindow, Window};
use jiff::tz::{Offset, TimeZone};

const S: u64 = 1_000_000_000;
const H: u64 = 3600 * S;

fn cw(calendar: Calendar, zone: &str) -> CalendarWindow {
    CalendarWindow::from_zone_name(calendar, zone).unwrap()
}

/// `window_at` over the window: its first and last nanosecond, and its neighbours.
fn assert_window(cw: &CalendarWindow, index: u64, start_s: u64, end_s: u64) {
    let w = Window {
        index,
        start_ns: start_s * S,
        end_ns: end_s * S,
    };
    assert_eq!(cw.window_at(w.start_ns), w, "first ns of {w:?}");
    assert_eq!(cw.window_at(w.end_ns - 1), w, "last ns of {w:?}");
    assert_eq!(cw.window_at(w.start_ns - 1).index, index - 1);
    assert_eq!(cw.window_at(w.end_ns).index, index + 1);
    assert_eq!(cw.start_of(index), w.start_ns);
    assert_eq!(cw.end_of(index), w.end_ns);
}

#[test]
fn month_utc_february_and_year_end() {
    let m = cw(Calendar::Month, "UTC");
    // Feb 2027: 2027-02-01T00:00Z = 1801440000, 2027-03-01T00:00Z = 1803859200: 28 days.
    assert_window(&m, 58 * 12 + 2 - 12, 1_801_440_000, 1_803_859_200);
    assert_eq!(1_803_859_200 - 1_801_440_000, 28 * 86_400);
    // Feb 2028 (leap): 2028-02-01 = 1832976000, 2028-03-01 = 1835481600: 29 days.
    assert_window(&m, 59 * 12 + 2 - 12, 1_832_976_000, 1_835_481_600);
    assert_eq!(1_835_481_600 - 1_832_976_000, 29 * 86_400);
    // Jan 31 2027 23:59:59.999999999 is January (685); one ns later is February (686).
    assert_eq!(m.window_at(1_801_440_000 * S - 1).index, 685);
    assert_eq!(m.window_at(1_801_440_000 * S).index, 686);
    // Dec 31 2027 23:59:59.999999999 is December (696); 2028-01-01 = 1830297600 is 697.
    let dec = m.window_at(1_830_297_600 * S - 1);
    assert_eq!((dec.index, dec.end_ns), (696, 1_830_297_600 * S));
    assert_eq!(m.window_at(1_830_297_600 * S).index, 697);
    let y = cw(Calendar::Year, "UTC");
    assert_eq!(y.window_at(1_830_297_600 * S - 1).index, 58);
    assert_eq!(y.window_at(1_830_297_600 * S).index, 59);
}

#[test]
fn month_paris_across_dst() {
    let m = cw(Calendar::Month, "Europe/Paris");
    // March 2027: 03-01T00:00+01 = 02-28T23:00Z = 1803855600; 04-01T00:00+02 = 03-31T22:00Z =
    // 1806530400. Clocks go forward 2027-03-28T01:00Z: 31 days less one hour, 743 h.
    assert_window(&m, 687, 1_803_855_600, 1_806_530_400);
    assert_eq!(m.end_of(687) - m.start_of(687), 743 * H);
    // October 2027: 10-01T00:00+02 = 09-30T22:00Z = 1822341600; 11-01T00:00+01 =
    // 10-31T23:00Z = 1825023600. Clocks go back 2027-10-31T01:00Z: 745 h.
    assert_window(&m, 694, 1_822_341_600, 1_825_023_600);
    assert_eq!(m.end_of(694) - m.start_of(694), 745 * H);
}

#[test]
fn iso_weeks() {
    let w = cw(Calendar::Week, "Europe/Paris");
    // Mon 2027-03-22 00:00+01 = 03-21T23:00Z = 1805670000 (UNIX day 20899, index 20902 / 7);
    // Mon 03-29 00:00+02 = 03-28T22:00Z = 1806271200: 167 h.
    assert_window(&w, 2986, 1_805_670_000, 1_806_271_200);
    assert_eq!(1_806_271_200 - 1_805_670_000, 167 * 3600);
    // Mon 2027-10-25 00:00+02 = 10-24T22:00Z = 1824415200 (day 21116, index 21119 / 7);
    // Mon 11-01 00:00+01 = 10-31T23:00Z = 1825023600: 169 h.
    assert_window(&w, 3017, 1_824_415_200, 1_825_023_600);
    assert_eq!(1_825_023_600 - 1_824_415_200, 169 * 3600);
    // Year end in UTC: Thu 2026-12-31 to Sun 2027-01-03 are in ISO week 2026-W53, from Mon
    // 2026-12-28 = 1798416000 (day 20815, index 20818 / 7) to Mon 2027-01-04 = 1799020800.
    let u = cw(Calendar::Week, "UTC");
    assert_window(&u, 2974, 1_798_416_000, 1_799_020_800);
    // 2027-01-01T12:00Z = 1798804800 (a Friday) is in it.
    assert_eq!(u.window_at(1_798_804_800 * S).index, 2974);
}

#[test]
fn year_new_york() {
    let y = cw(Calendar::Year, "America/New_York");
    // 2027-01-01T00:00-05 = 05:00Z = 1798779600; 2028-01-01T00:00-05 = 1830315600.
    assert_window(&y, 58, 1_798_779_600, 1_830_315_600);
    // 2027-01-01T04:59:59.999999999Z is still 2026-12-31 in New York.
    assert_eq!(y.window_at(1_798_779_600 * S - 1).index, 57);
}

#[test]
fn day_lord_howe_half_hour_dst() {
    let d = cw(Calendar::Day, "Australia/Lord_Howe");
    // 2027-10-03 (day 21094): 00:00+10:30 = 10-02T13:30Z = 1822483800; 10-04 00:00+11 =
    // 10-03T13:00Z = 1822568400; clocks go 02:00 -> 02:30: 23.5 h.
    assert_window(&d, 21_097, 1_822_483_800, 1_822_568_400);
    assert_eq!(1_822_568_400 - 1_822_483_800, 23 * 3600 + 1800);
    // 2027-04-04 (day 20912): 00:00+11 = 04-03T13:00Z = 1806757200; 04-05 00:00+10:30 =
    // 04-04T13:30Z = 1806845400; clocks go 02:00 -> 01:30: 24.5 h.
    assert_window(&d, 20_915, 1_806_757_200, 1_806_845_400);
}

#[test]
fn midnight_in_a_gap_or_a_fold() {
    let d = cw(Calendar::Day, "America/Santiago");
    // 2027-09-05: 00:00 -04 does not exist (-> 01:00 -03 at 04:00Z). Compatible: the offset
    // before, -04, so 04:00Z = 1820116800, the transition. The day before is 24 h, from
    // 09-04T04:00Z = 1820030400; this one is 23 h, to 09-06T00:00-03 = 03:00Z = 1820199600.
    assert_window(&d, 21_068, 1_820_030_400, 1_820_116_800);
    assert_window(&d, 21_069, 1_820_116_800, 1_820_199_600);
    // 2027-04-03: 00:00-03 = 03:00Z = 1806721200; 23:00-24:00 repeats (03:00Z back to 23:00
    // -04), then 04-04T00:00-04 = 04:00Z = 1806811200: 25 h.
    assert_window(&d, 20_914, 1_806_721_200, 1_806_811_200);

    let h = cw(Calendar::Day, "America/Havana");
    // 2027-03-14: 00:00 CST does not exist (05:00Z -> 01:00 CDT): from 05:00Z = 1805000400
    // to 03-15T00:00-04 = 04:00Z = 1805083200, 23 h; 03-13 from 05:00Z = 1804914000.
    assert_window(&h, 20_893, 1_804_914_000, 1_805_000_400);
    assert_window(&h, 20_894, 1_805_000_400, 1_805_083_200);
    // 2027-11-07: 00:00 happens twice (01:00 CDT at 05:00Z back to 00:00 CST). Compatible:
    // the first, 00:00-04 = 04:00Z = 1825560000; to 11-08T00:00-05 = 1825650000: 25 h.
    assert_window(&h, 21_131, 1_825_473_600, 1_825_560_000);
    assert_window(&h, 21_132, 1_825_560_000, 1_825_650_000);
}

#[test]
fn straddled_midnight_belongs_to_the_tiling_window() {
    // A zone whose gap (23:30 -> 00:30) and fold (00:30 -> 23:30) straddle midnight (none in
    // tzdb since 2011; America/St_Johns went back at 00:01 until then).
    let tz = TimeZone::posix("XST3XDT,M3.2.0/23:30,M11.1.0/0:30").unwrap();
    let d = CalendarWindow::new(Calendar::Day, tz);
    // Gap at 2027-03-15T02:30Z = 1805077800. Mon 03-15 00:00 -03 (compatible) = 03:00Z =
    // 1805079600, i.e. 01:00 XDT. 02:40Z reads 00:40 on Monday, yet is in Sunday's window,
    // 03-14T03:00Z = 1804993200 to 1805079600.
    assert_window(&d, 20_894, 1_804_993_200, 1_805_079_600);
    assert_eq!(d.window_at((1_805_077_800 + 600) * S).index, 20_894);
    // Fold at 2027-11-07T02:30Z = 1825554600 (00:30 XDT back to 23:30 XST). Sun 11-07 00:00
    // first occurs at 00:00-02 = 02:00Z = 1825552800. 02:40Z reads Sat 23:40, yet is in
    // Sunday's window, 1825552800 to 11-08T00:00-03 = 1825642800 (25 h).
    assert_window(&d, 21_131, 1_825_466_400, 1_825_552_800);
    assert_window(&d, 21_132, 1_825_552_800, 1_825_642_800);
    assert_eq!(d.window_at((1_825_554_600 + 600) * S).index, 21_132);
}

#[test]
fn skipped_day_is_an_empty_window() {
    // Pacific/Apia went from Thu 2011-12-29 23:59:59 -10 to Sat 12-31 00:00 +14 at
    // 12-30T10:00Z = 1325239200. 12-29 (day 15337) from 10:00Z on 12-29 = 1325152800.
    let d = cw(Calendar::Day, "Pacific/Apia");
    let w = d.window_at(1_325_239_200 * S - 1);
    assert_eq!(
        w,
        Window {
            index: 15_340,
            start_ns: 1_325_152_800 * S,
            end_ns: 1_325_239_200 * S
        }
    );
    assert_eq!((d.start_of(15_341), d.end_of(15_341)), (w.end_ns, w.end_ns));
    let next = d.window_at(w.end_ns);
    assert_eq!((next.index, next.start_ns), (15_342, w.end_ns));
}

#[test]
fn range_edges_saturate() {
    // At the epoch, 1970-01-01T09:00 in Tokyo: its day began before 0.
    let d = cw(Calendar::Day, "Asia/Tokyo");
    assert_eq!(
        d.window_at(0),
        Window {
            index: 3,
            start_ns: 0,
            end_ns: 15 * H
        }
    );
    // ... and 1969-12-31T19:00 in New York: day 2, until 05:00Z.
    let ny = cw(Calendar::Day, "America/New_York");
    assert_eq!(
        ny.window_at(0),
        Window {
            index: 2,
            start_ns: 0,
            end_ns: 5 * H
        }
    );
    for offset in [Offset::MIN, Offset::MAX] {
        for calendar in [
            Calendar::Day,
            Calendar::Week,
            Calendar::Month,
            Calendar::Year,
        ] {
            let c = CalendarWindow::new(calendar, TimeZone::fixed(offset));
            let first = c.window_at(0);
            assert_eq!(first.start_ns, 0);
            assert!(first.end_ns > 0);
            // u64::MAX ns = 2554-07-21T23:34:33.709551615Z: the last window ends saturated.
            let last = c.window_at(u64::MAX);
            assert_eq!(last.end_ns, u64::MAX);
            assert!(last.start_ns < u64::MAX);
            assert_eq!(c.start_of(last.index), last.start_ns);
            assert_eq!(c.start_of(last.index + 1), u64::MAX);
            assert_eq!(c.start_of(u64::MAX), u64::MAX);
            assert_eq!(c.end_of(u64::MAX), u64::MAX);
            assert_eq!(c.start_of(0), 0);
        }
    }
    // The last year: 2554 in UTC, index 585, from 2554-01-01 = 18429292800 s.
    let y = cw(Calendar::Year, "UTC");
    assert_eq!(
        y.window_at(u64::MAX),
        Window {
            index: 585,
            start_ns: 18_429_292_800 * S,
            end_ns: u64::MAX
        }
    );
}

#[test]
fn cached_lookup() {
    let m = cw(Calendar::Month, "Europe/Paris");
    let mut cache = Window::default();
    assert!(!cache.contains(0));
    let mut now = 1_803_855_600 * S - 5 * H;
    while now < 1_806_530_400 * S + 5 * H {
        let w = m.window_cached(now, &cache);
        assert_eq!(w, m.window_at(now));
        cache = w;
        now += 997 * S;
    }
}

#[test]
fn parse_names() {
    for (text, calendar) in [
        ("day", Calendar::Day),
        ("week", Calendar::Week),
        ("month", Calendar::Month),
        ("year", Calendar::Year),
    ] {
        assert_eq!(text.parse::<Calendar>().unwrap(), calendar);
        assert_eq!(calendar.to_string(), text);
    }
    let e = "fortnight".parse::<Calendar>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown calendar period `fortnight`: expected one of day, week, month, year"
    );
    assert!("Month".parse::<Calendar>().is_err());
    let e = CalendarWindow::from_zone_name(Calendar::Day, "Mars/Olympus_Mons").unwrap_err();
    assert_eq!(e.zone, "Mars/Olympus_Mons");
    assert!(
        e.to_string()
            .starts_with("unknown time zone `Mars/Olympus_Mons`: "),
        "{e}"
    );
    let ok = CalendarWindow::from_zone_name(Calendar::Year, "Europe/Paris").unwrap();
    assert_eq!(ok.calendar(), Calendar::Year);
    assert_eq!(ok.tz.iana_name(), Some("Europe/Paris"));
}

#[test]
fn a_warp_maps_each_month_onto_one_nominal_window() {
    use super::Warp;
    let warp = Warp::new(cw(Calendar::Month, "UTC"));
    let day = 86_400 * S;
    // 2027-02-01T00:00:00Z and 2027-03-01: February is 28 days, counted as one window of 31.
    let (feb, mar) = (1_801_440_000 * S, 1_803_859_200 * S);
    let nominal = 31 * day;
    let at = warp.at(feb);
    assert_eq!(at.now % nominal, 0);
    let end = warp.at(mar - 1);
    assert_eq!(
        end.now / nominal,
        at.now / nominal,
        "the last ns is the same window"
    );
    assert_eq!(warp.at(mar).now / nominal, at.now / nominal + 1);
    // Half of February gone: half the nominal window gone, and the rest maps back to 14 days.
    let mid = warp.at(feb + 14 * day);
    assert_eq!(mid.now % nominal, nominal / 2);
    assert_eq!(mid.real(nominal / 2), 14 * day);
}

mod props {
    use super::super::{Calendar, CalendarWindow, Window};
    use jiff::{Timestamp, tz};
    use proptest::prelude::*;

    const CALENDARS: [Calendar; 4] = [
        Calendar::Day,
        Calendar::Week,
        Calendar::Month,
        Calendar::Year,
    ];
    const ZONES: [&str; 12] = [
        "UTC",
        "Europe/Paris",
        "America/New_York",
        "Australia/Lord_Howe",
        "America/Santiago",
        "America/Havana",
        "Asia/Beirut",
        "America/St_Johns",
        "Pacific/Chatham",
        "Pacific/Kiritimati",
        "Pacific/Apia",
        "Asia/Kolkata",
    ];
    /// 2200-01-01T00:00:00Z.
    const NS_2200: u64 = 7_258_118_400 * 1_000_000_000;

    /// The window of `now` holds it, is the window of its first and last nanosecond, matches
    /// `start_of`/`end_of`, and its neighbours touch it. Indexes skipped between neighbours belong
    /// to empty windows (a skipped day); `strict` says there are none.
    fn check(cw: &CalendarWindow, now: u64, strict: bool) -> Window {
        check_skips(cw, now, strict).0
    }

    /// [`check`], and how many empty windows follow the window of `now`.
    fn check_skips(cw: &CalendarWindow, now: u64, strict: bool) -> (Window, u64) {
        let w = cw.window_at(now);
        let at = |what: &str| format!("{what}: {cw:?} now={now} {w:?}");
        assert!(w.start_ns <= now && now < w.end_ns, "{}", at("contains"));
        assert_eq!(cw.window_at(w.start_ns), w, "{}", at("start"));
        assert_eq!(cw.window_at(w.end_ns - 1), w, "{}", at("end - 1"));
        assert_eq!(cw.start_of(w.index), w.start_ns, "{}", at("start_of"));
        assert_eq!(cw.end_of(w.index), w.end_ns, "{}", at("end_of"));
        assert_eq!(cw.window_cached(now, &w), w);
        assert_eq!(cw.window_cached(now, &Window::default()), w);
        let next = cw.window_at(w.end_ns);
        assert_eq!(next.start_ns, w.end_ns, "{}", at("next start"));
        assert!(next.index > w.index, "{}", at("next index"));
        if strict {
            assert_eq!(next.index, w.index + 1, "{}", at("next index"));
        }
        for skipped in w.index + 1..next.index {
            assert_eq!(cw.start_of(skipped), w.end_ns, "{}", at("skipped start"));
            assert_eq!(cw.end_of(skipped), w.end_ns, "{}", at("skipped end"));
        }
        if w.start_ns > 0 {
            let prev = cw.window_at(w.start_ns - 1);
            assert_eq!(prev.end_ns, w.start_ns, "{}", at("prev end"));
            assert!(prev.index < w.index, "{}", at("prev index"));
            if strict {
                assert_eq!(prev.index + 1, w.index, "{}", at("prev index"));
            }
        }
        (w, next.index - w.index - 1)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn windows_tile(now in 0..NS_2200, zone in 0..ZONES.len(), calendar in 0..CALENDARS.len()) {
            let cw = CalendarWindow::from_zone_name(CALENDARS[calendar], ZONES[zone]).unwrap();
            check(&cw, now, ZONES[zone] != "Pacific/Apia");
        }

        #[test]
        fn any_u64_is_safe(now: u64, index: u64, zone in 0..ZONES.len(), calendar in 0..CALENDARS.len()) {
            let cw = CalendarWindow::from_zone_name(CALENDARS[calendar], ZONES[zone]).unwrap();
            let w = cw.window_at(now);
            prop_assert!(w.start_ns <= now && (now < w.end_ns || w.end_ns == u64::MAX));
            prop_assert!(cw.start_of(index) <= cw.end_of(index));
        }
    }

    /// Around every transition from 1970 to 2040 (past the tables, into the rules) of every zone (and alias): one second before, the
    /// nanosecond before, the transition, the nanosecond after, an hour after. The only empty
    /// windows are the days skipped when a zone crossed the date line.
    #[test]
    fn every_transition_of_every_zone() {
        let until = Timestamp::from_second(2_208_988_800).unwrap(); // 2040-01-01
        let mut checked = 0u64;
        let mut skips = Vec::new();
        for name in tz::db().available() {
            let tz = tz::db().get(name.as_str()).unwrap();
            let windows = CALENDARS.map(|c| CalendarWindow::new(c, tz.clone()));
            for transition in tz.following(Timestamp::UNIX_EPOCH) {
                let ts = transition.timestamp();
                if ts > until {
                    break;
                }
                let t = u64::try_from(ts.as_nanosecond()).unwrap();
                for now in [t - 1_000_000_000, t - 1, t, t + 1, t + 3_600_000_000_000] {
                    for cw in &windows {
                        let (w, skipped) = check_skips(cw, now, false);
                        if skipped > 0 {
                            let after = Timestamp::from_nanosecond(w.end_ns.into()).unwrap();
                            let skipped_day = tz.to_datetime(after).date().yesterday().unwrap();
                            skips.push(format!(
                                "{} {:?} {skipped_day}",
                                name.as_str(),
                                cw.calendar()
                            ));
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100_000, "{checked}");
        skips.sort();
        skips.dedup();
        assert_eq!(
            skips,
            [
                "Kwajalein Day 1993-08-21",
                "Pacific/Apia Day 2011-12-30",
                "Pacific/Enderbury Day 1994-12-31",
                "Pacific/Fakaofo Day 2011-12-30",
                "Pacific/Kanton Day 1994-12-31",
                "Pacific/Kiritimati Day 1994-12-31",
                "Pacific/Kwajalein Day 1993-08-21",
            ]
        );
    }
}
